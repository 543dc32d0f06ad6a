package sandboxnet

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// tableName is sandman's table in a slot's namespace.
const tableName = "sandman"

// Apply replaces the firewall of the network namespace at nsPath with p, in
// one netlink batch. Replacing deletes the old table, and a deletion waits
// for an RCU grace period in the kernel (~13 ms here): on a bind, AddPod on
// a slot reset to its base is what runs.
func Apply(nsPath string, p Policy) error {
	return batch(nsPath, func(b *builder) {
		b.self = p.Self
		// Add then delete: deleting a table that is not there fails the batch.
		b.c.AddTable(b.t)
		b.c.DelTable(b.t)
		b.c.AddTable(b.t)
		b.base(p)
		b.pod(p)
	})
}

// Reset replaces the firewall at nsPath with p's base: what a slot without
// a pod has (the pool's egress; inbound, the node to the first daemon).
func Reset(nsPath string, p Policy) error {
	return Apply(nsPath, Policy{Internet: p.Internet, Allow: p.Allow, Deny: p.Deny, Self: p.Self})
}

// AddPod adds p's pod parts (its ports, egress narrowing, denied ranges
// and rules) to a firewall that Reset left with the same base: they go
// into chains the base has empty. It only adds (no deletion, so no grace
// period): ~0.1 ms.
func AddPod(nsPath string, p Policy) error {
	return batch(nsPath, func(b *builder) {
		b.self = p.Self
		b.pod(p)
	})
}

func batch(nsPath string, write func(*builder)) error {
	ns, err := os.Open(nsPath)
	if err != nil {
		return fmt.Errorf("sandbox firewall: open network namespace: %w", err)
	}
	defer ns.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.Fd())))
	if err != nil {
		return fmt.Errorf("sandbox firewall: %w", err)
	}
	write(&builder{c: c, t: &nftables.Table{Name: tableName, Family: nftables.TableFamilyINet}})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("sandbox firewall: write the rules: %w", err)
	}
	return nil
}

// builder writes a policy's chains into a table. The base, made with the
// slot, has a place for each part a pod adds:
//
//	egress (output hook): lo, replies, IPv6 → pod_out → pool
//	pod_out: [the pod's PodDeny: reject]; [the pod's EgressTo: a matching peer
//	  and port jumps to pool; reject]
//	pool: Allow, Deny, [no internet: reject] → pod_only, accept (every path a verdict)
//	pod_only: [the pod's Only: accept those; reject]
//	ingress (input hook): lo, replies, ICMP → ports, reject
//	ports: the node's addresses to the first daemon; [the pod's ports: accept,
//	  or → from when IngressFrom narrows]
//	from: [a rule per IngressFrom peer and port: accept]
//
// A peer with exceptions gets a chain of its own whose exceptions return.
type builder struct {
	c      *nftables.Conn
	t      *nftables.Table
	self   []netip.Prefix
	chains int
}

func (b *builder) chain(name string, hook *nftables.ChainHook) *nftables.Chain {
	ch := &nftables.Chain{Name: name, Table: b.t}
	if hook != nil {
		accept := nftables.ChainPolicyAccept
		ch.Type, ch.Hooknum, ch.Priority, ch.Policy = nftables.ChainTypeFilter, hook, nftables.ChainPriorityFilter, &accept
		return b.c.AddChain(ch)
	}
	return b.c.AddChain(ch)
}

// existing names a chain of the table for rules to be added to.
func (b *builder) existing(name string) *nftables.Chain {
	return &nftables.Chain{Name: name, Table: b.t}
}

func (b *builder) rule(ch *nftables.Chain, parts ...[]expr.Any) {
	b.c.AddRule(&nftables.Rule{Table: b.t, Chain: ch, Exprs: cat(parts...)})
}

func (b *builder) base(p Policy) {
	b.chain("pod_out", nil)
	b.chain("pod_only", nil)
	b.chain("from", nil)
	pool := b.chain("pool", nil)
	for _, r := range poolRules(p) {
		b.rule(pool, r)
	}
	out := b.chain("egress", nftables.ChainHookOutput)
	b.rule(out, ifname(expr.MetaKeyOIFNAME, "lo"), verdict(expr.VerdictAccept))
	b.rule(out, ctReplies(), verdict(expr.VerdictAccept))
	b.rule(out, nfproto(unix.NFPROTO_IPV6), reject())
	b.rule(out, jump(expr.VerdictJump, "pod_out"))
	b.rule(out, jump(expr.VerdictJump, "pool"))

	ports := b.chain("ports", nil)
	b.selfRules(ports, []uint16{firstDaemonPort})
	in := b.chain("ingress", nftables.ChainHookInput)
	b.rule(in, ifname(expr.MetaKeyIIFNAME, "lo"), verdict(expr.VerdictAccept))
	b.rule(in, ctReplies(), verdict(expr.VerdictAccept))
	b.rule(in, l4proto(unix.IPPROTO_ICMP), verdict(expr.VerdictAccept))
	b.rule(in, jump(expr.VerdictJump, "ports"))
	b.rule(in, reject())
}

// selfRules let the node's addresses reach ports (TCP).
func (b *builder) selfRules(ch *nftables.Chain, ports []uint16) {
	for _, a := range b.self {
		for _, port := range ports {
			b.rule(ch, nfproto(unix.NFPROTO_IPV4), addrMatch(saddrOffset, a), l4proto(unix.IPPROTO_TCP), dport(port, 0), verdict(expr.VerdictAccept))
		}
	}
}

// pod adds what the bound pod brings to the base's chains.
func (b *builder) pod(p Policy) {
	podOut := b.existing("pod_out")
	// Before EgressTo and the pool's chain: the pod's own deny wins over
	// the pool's Allow.
	for _, d := range p.PodDeny {
		b.rule(podOut, nfproto(unix.NFPROTO_IPV4), addrMatch(daddrOffset, d), reject())
	}
	if p.EgressTo != nil {
		b.peerRules(podOut, p.EgressTo, daddrOffset, jump(expr.VerdictJump, "pool"))
		b.rule(podOut, reject())
	}
	if p.Internet && len(p.Only) > 0 {
		only := b.existing("pod_only")
		for _, o := range p.Only {
			b.rule(only, nfproto(unix.NFPROTO_IPV4), addrMatch(daddrOffset, o), verdict(expr.VerdictAccept))
		}
		b.rule(only, reject())
	}
	ports := b.existing("ports")
	var more []uint16
	for _, d := range p.DaemonPorts {
		if d != firstDaemonPort {
			more = append(more, d)
		}
	}
	b.selfRules(ports, more)
	open := verdict(expr.VerdictAccept)
	if p.IngressFrom != nil {
		b.peerRules(b.existing("from"), p.IngressFrom, saddrOffset, verdict(expr.VerdictAccept))
		open = jump(expr.VerdictJump, "from")
	}
	for _, port := range p.TCPPorts {
		b.rule(ports, l4proto(unix.IPPROTO_TCP), dport(port, 0), open)
	}
	for _, port := range p.UDPPorts {
		b.rule(ports, l4proto(unix.IPPROTO_UDP), dport(port, 0), open)
	}
}

// peerRules writes into ch, for every rule, peer and port, a match on the
// peer's address (at offset: source or destination) that ends in then.
func (b *builder) peerRules(ch *nftables.Chain, rules []Rule, offset uint32, then []expr.Any) {
	for _, r := range rules {
		peers := r.Peers
		if len(peers) == 0 {
			peers = []Peer{{Prefix: netip.PrefixFrom(netip.IPv4Unspecified(), 0)}}
		}
		ports := portMatches(r.Ports)
		for _, peer := range peers {
			target := ch
			if len(peer.Except) > 0 {
				b.chains++
				name := fmt.Sprintf("%s_%d", ch.Name, b.chains)
				target = b.chain(name, nil)
				for _, e := range peer.Except {
					b.rule(target, nfproto(unix.NFPROTO_IPV4), addrMatch(offset, e), verdict(expr.VerdictReturn))
				}
				b.rule(ch, nfproto(unix.NFPROTO_IPV4), addrMatch(offset, peer.Prefix), jump(expr.VerdictJump, name))
			}
			for _, pm := range ports {
				b.rule(target, nfproto(unix.NFPROTO_IPV4), addrMatch(offset, peer.Prefix), pm, then)
			}
		}
	}
}

func poolRules(p Policy) [][]expr.Any {
	var rules [][]expr.Any
	for _, a := range p.Allow {
		rules = append(rules, cat(nfproto(unix.NFPROTO_IPV4), addrMatch(daddrOffset, a), verdict(expr.VerdictAccept)))
	}
	for _, d := range p.Deny {
		rules = append(rules, cat(nfproto(unix.NFPROTO_IPV4), addrMatch(daddrOffset, d), reject()))
	}
	if !p.Internet {
		return append(rules, reject())
	}
	return append(rules, jump(expr.VerdictJump, "pod_only"), verdict(expr.VerdictAccept))
}

// portMatches are the expressions of a rule's ports; no ports: one empty
// match (any port).
func portMatches(ports []PortRange) [][]expr.Any {
	if len(ports) == 0 {
		return [][]expr.Any{nil}
	}
	var out [][]expr.Any
	for _, p := range ports {
		proto := byte(unix.IPPROTO_TCP)
		if p.Proto == "UDP" {
			proto = unix.IPPROTO_UDP
		}
		if p.Port == 0 {
			out = append(out, l4proto(proto))
			continue
		}
		out = append(out, cat(l4proto(proto), dport(p.Port, p.EndPort)))
	}
	return out
}

func jump(kind expr.VerdictKind, chain string) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: kind, Chain: chain}}
}

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

// reject answers with an ICMP "administratively prohibited" (a TCP connect
// fails at once with "no route to host"), for IPv4 and IPv6 alike.
func reject() []expr.Any {
	return []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}}
}

func ifname(key expr.MetaKey, name string) []expr.Any {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, name)
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b},
	}
}

func ctReplies() []expr.Any {
	mask := make([]byte, 4)
	binary.NativeEndian.PutUint32(mask, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED)
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: make([]byte, 4)},
	}
}

func nfproto(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

func l4proto(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}

// Offsets of the source and destination in the IPv4 header.
const (
	saddrOffset = 12
	daddrOffset = 16
)

// addrMatch matches the IPv4 address at offset against prefix.
func addrMatch(offset uint32, prefix netip.Prefix) []expr.Any {
	addr := prefix.Masked().Addr().As4()
	mask := make([]byte, 4)
	if prefix.Bits() > 0 {
		binary.BigEndian.PutUint32(mask, ^uint32(0)<<(32-prefix.Bits()))
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr[:]},
	}
}

// dport matches a TCP or UDP destination port, or ports port to end (after
// an l4proto match).
func dport(port, end uint16) []expr.Any {
	b := make([]byte, 2)
	binary.BigEndian.PutUint16(b, port)
	load := &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
	if end > port {
		e := make([]byte, 2)
		binary.BigEndian.PutUint16(e, end)
		return []expr.Any{load, &expr.Range{Op: expr.CmpOpEq, Register: 1, FromData: b, ToData: e}}
	}
	return []expr.Any{load, &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b}}
}

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
// one netlink batch.
func Apply(nsPath string, p Policy) error {
	ns, err := os.Open(nsPath)
	if err != nil {
		return fmt.Errorf("sandbox firewall: open network namespace: %w", err)
	}
	defer ns.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.Fd())))
	if err != nil {
		return fmt.Errorf("sandbox firewall: %w", err)
	}
	t := &nftables.Table{Name: tableName, Family: nftables.TableFamilyINet}
	// Add then delete: deleting a table that is not there fails the batch.
	c.AddTable(t)
	c.DelTable(t)
	c.AddTable(t)
	(&builder{c: c, t: t}).build(p)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("sandbox firewall: write the rules: %w", err)
	}
	return nil
}

// builder writes a policy's chains into a table:
//
//	egress (output hook): lo, replies, IPv6 → [np_out →] pool
//	pool: Allow, Deny, internet, Only — every path ends in a verdict
//	np_out: a rule per EgressTo peer and port; a match jumps to pool
//	ingress (input hook): lo, replies, ICMP, open ports → [from]
//	from: a rule per IngressFrom peer and port; a match accepts
//
// A peer with exceptions gets a chain of its own whose exceptions return.
type builder struct {
	c      *nftables.Conn
	t      *nftables.Table
	chains int
}

func (b *builder) chain(name string, hook *nftables.ChainHook) *nftables.Chain {
	ch := &nftables.Chain{Name: name, Table: b.t}
	if hook != nil {
		accept := nftables.ChainPolicyAccept
		ch.Type, ch.Hooknum, ch.Priority, ch.Policy = nftables.ChainTypeFilter, hook, nftables.ChainPriorityFilter, &accept
	}
	return b.c.AddChain(ch)
}

func (b *builder) rule(ch *nftables.Chain, parts ...[]expr.Any) {
	b.c.AddRule(&nftables.Rule{Table: b.t, Chain: ch, Exprs: cat(parts...)})
}

func (b *builder) build(p Policy) {
	pool := b.chain("pool", nil)
	for _, r := range poolRules(p) {
		b.rule(pool, r)
	}
	out := b.chain("egress", nftables.ChainHookOutput)
	b.rule(out, ifname(expr.MetaKeyOIFNAME, "lo"), verdict(expr.VerdictAccept))
	b.rule(out, ctReplies(), verdict(expr.VerdictAccept))
	b.rule(out, nfproto(unix.NFPROTO_IPV6), reject())
	if p.EgressTo == nil {
		b.rule(out, jump(expr.VerdictJump, "pool"))
	} else {
		npOut := b.chain("np_out", nil)
		b.peerRules(npOut, p.EgressTo, daddrOffset, jump(expr.VerdictJump, "pool"))
		b.rule(out, jump(expr.VerdictJump, "np_out"))
		b.rule(out, reject())
	}

	in := b.chain("ingress", nftables.ChainHookInput)
	b.rule(in, ifname(expr.MetaKeyIIFNAME, "lo"), verdict(expr.VerdictAccept))
	b.rule(in, ctReplies(), verdict(expr.VerdictAccept))
	b.rule(in, l4proto(unix.IPPROTO_ICMP), verdict(expr.VerdictAccept))
	open := verdict(expr.VerdictAccept)
	if p.IngressFrom != nil {
		from := b.chain("from", nil)
		b.peerRules(from, p.IngressFrom, saddrOffset, verdict(expr.VerdictAccept))
		open = jump(expr.VerdictJump, "from")
	}
	for _, port := range p.TCPPorts {
		b.rule(in, l4proto(unix.IPPROTO_TCP), dport(port, 0), open)
	}
	for _, port := range p.UDPPorts {
		b.rule(in, l4proto(unix.IPPROTO_UDP), dport(port, 0), open)
	}
	b.rule(in, reject())
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
	switch {
	case !p.Internet:
		rules = append(rules, reject())
	case len(p.Only) > 0:
		for _, o := range p.Only {
			rules = append(rules, cat(nfproto(unix.NFPROTO_IPV4), addrMatch(daddrOffset, o), verdict(expr.VerdictAccept)))
		}
		rules = append(rules, reject())
	default:
		rules = append(rules, verdict(expr.VerdictAccept))
	}
	return rules
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

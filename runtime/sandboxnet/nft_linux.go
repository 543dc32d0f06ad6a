package sandboxnet

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"

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
//
// The addresses pinned in p.ResolvedSet, if it is there, stay pinned for
// what is left of their timeouts.
func Apply(nsPath string, p Policy) error {
	var pinned []nftables.SetElement
	if p.ResolvedSet != "" {
		pinned = pinnedAddrs(nsPath, p.ResolvedSet)
	}
	return batch(nsPath, func(b *builder) {
		b.self = p.Self
		// Add then delete: deleting a table that is not there fails the batch.
		b.c.AddTable(b.t)
		b.c.DelTable(b.t)
		b.c.AddTable(b.t)
		b.base(p)
		set := b.pod(p)
		if set != nil && len(pinned) > 0 {
			b.fail(b.c.SetAddElements(set, pinned))
		}
	})
}

// pinnedAddrs are the elements of set in the namespace at nsPath, each
// with what is left of its timeout (none when the set is not there).
func pinnedAddrs(nsPath, set string) []nftables.SetElement {
	ns, err := os.Open(nsPath)
	if err != nil {
		return nil
	}
	defer ns.Close()
	c, err := nftables.New(nftables.WithNetNSFd(int(ns.Fd())))
	if err != nil {
		return nil
	}
	s, err := c.GetSetByName(&nftables.Table{Name: tableName, Family: nftables.TableFamilyINet}, set)
	if err != nil {
		return nil
	}
	elems, err := c.GetSetElements(s)
	if err != nil {
		return nil
	}
	var out []nftables.SetElement
	for _, e := range elems {
		if e.Expires > 0 {
			out = append(out, nftables.SetElement{Key: e.Key, Timeout: e.Expires})
		}
	}
	return out
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
	b := &builder{c: c, t: &nftables.Table{Name: tableName, Family: nftables.TableFamilyINet}}
	write(b)
	if b.err != nil {
		return fmt.Errorf("sandbox firewall: %w", b.err)
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("sandbox firewall: write the rules: %w", err)
	}
	return nil
}

// builder writes a policy's chains into a table. The base, made with the
// slot, has a place for each part a pod adds:
//
//	egress (output hook): lo, replies, IPv6 → pod_out → pool
//	pod_out: [the Resolver's port: accept]; [the pod's PodDeny: reject];
//	  [the pod's EgressTo: a matching peer and port jumps to pool; reject]
//	pool: Allow, Deny, [no internet: reject] → pod_only, accept (every path a verdict)
//	pod_only: [the pod's Only, and with a Resolver its ResolvedSet: accept
//	  those; reject]
//
// With a Resolver the pod also brings the set ResolvedSet and two NAT
// chains: dns (output hook) sends port 53 to the resolver, and dns_src
// (postrouting) gives what was sent from the loopback (an image whose
// resolv.conf names no server asks 127.0.0.1) the slot's address, which
// the resolver knows the sandbox by.
//
//	ingress (input hook): lo, replies, ICMP → ports, reject
//	ports: the node's addresses to the first daemon; [the pod's ports: accept,
//	  or → from when IngressFrom narrows]; [the pod's ControlPorts: accept
//	  from the node's addresses and ControlFrom]
//	from: [a rule per IngressFrom peer and port: accept]
//
// A peer with exceptions gets a chain of its own whose exceptions return.
type builder struct {
	c      *nftables.Conn
	t      *nftables.Table
	self   []netip.Prefix
	chains int
	// err is the first error of a message the batch could not be given.
	err error
}

func (b *builder) fail(err error) {
	if b.err == nil {
		b.err = err
	}
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

// pod adds what the bound pod brings to the base's chains; it returns
// the set of its pinned addresses, if it has one.
func (b *builder) pod(p Policy) *nftables.Set {
	podOut := b.existing("pod_out")
	var resolved *nftables.Set
	if p.Resolver.IsValid() {
		resolved = b.resolver(podOut, p)
	}
	// Before EgressTo and the pool's chain: the pod's own deny wins over
	// the pool's Allow.
	for _, d := range p.PodDeny {
		b.rule(podOut, nfproto(unix.NFPROTO_IPV4), addrMatch(daddrOffset, d), reject())
	}
	if p.EgressTo != nil {
		b.peerRules(podOut, p.EgressTo, daddrOffset, jump(expr.VerdictJump, "pool"))
		b.rule(podOut, reject())
	}
	if p.Internet && (len(p.Only) > 0 || resolved != nil) {
		only := b.existing("pod_only")
		for _, o := range p.Only {
			b.rule(only, nfproto(unix.NFPROTO_IPV4), addrMatch(daddrOffset, o), verdict(expr.VerdictAccept))
		}
		if resolved != nil {
			b.rule(only, nfproto(unix.NFPROTO_IPV4), loadAddr(daddrOffset),
				[]expr.Any{&expr.Lookup{SourceRegister: 1, SetName: resolved.Name, SetID: resolved.ID}}, verdict(expr.VerdictAccept))
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
	// The control plane's ports: Self and ControlFrom only, before and
	// apart from IngressFrom (an accept, or on to the rules above).
	for _, r := range p.ControlPorts {
		for _, a := range slices.Concat(b.self, p.ControlFrom) {
			b.rule(ports, nfproto(unix.NFPROTO_IPV4), addrMatch(saddrOffset, a), l4proto(unix.IPPROTO_TCP), dport(r.Port, r.EndPort), verdict(expr.VerdictAccept))
		}
	}
	for _, port := range p.UDPPorts {
		b.rule(ports, l4proto(unix.IPPROTO_UDP), dport(port, 0), open)
	}
	return resolved
}

// resolver adds what a pod whose names resolve through the node's
// resolver brings: its port reachable (first in pod_out: the pod asked
// for it, and nothing but DNS goes there), port 53 redirected to it, and
// the set its answers are pinned into.
func (b *builder) resolver(podOut *nftables.Chain, p Policy) *nftables.Set {
	addr := p.Resolver.Addr().As4()
	port := binary.BigEndian.AppendUint16(nil, p.Resolver.Port())
	to := netip.PrefixFrom(p.Resolver.Addr(), 32)
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		b.rule(podOut, nfproto(unix.NFPROTO_IPV4), addrMatch(daddrOffset, to), l4proto(proto), dport(p.Resolver.Port(), 0), verdict(expr.VerdictAccept))
	}
	dns := b.natChain("dns", nftables.ChainHookOutput, nftables.ChainPriorityNATDest)
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		b.rule(dns, nfproto(unix.NFPROTO_IPV4), l4proto(proto), dport(53, 0), []expr.Any{
			&expr.Immediate{Register: 1, Data: addr[:]},
			&expr.Immediate{Register: 2, Data: port},
			&expr.NAT{Type: expr.NATTypeDestNAT, Family: unix.NFPROTO_IPV4, RegAddrMin: 1, RegProtoMin: 2, Specified: true},
		})
	}
	src := b.natChain("dns_src", nftables.ChainHookPostrouting, nftables.ChainPriorityNATSource)
	b.rule(src, nfproto(unix.NFPROTO_IPV4), addrMatch(saddrOffset, netip.MustParsePrefix("127.0.0.0/8")),
		ifnameNot(expr.MetaKeyOIFNAME, "lo"), []expr.Any{&expr.Masq{}})
	set := &nftables.Set{Table: b.t, Name: p.ResolvedSet, KeyType: nftables.TypeIPAddr, HasTimeout: true}
	b.fail(b.c.AddSet(set, nil))
	return set
}

func (b *builder) natChain(name string, hook *nftables.ChainHook, prio *nftables.ChainPriority) *nftables.Chain {
	accept := nftables.ChainPolicyAccept
	return b.c.AddChain(&nftables.Chain{Name: name, Table: b.t, Type: nftables.ChainTypeNAT, Hooknum: hook, Priority: prio, Policy: &accept})
}

// addUpdatesTimeout: adding an element that is there gives it the new
// timeout (Linux 6.12 and later; before, the add changes nothing).
var addUpdatesTimeout = sync.OnceValue(func() bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	var major, minor int
	_, err := fmt.Sscanf(unix.ByteSliceToString(u.Release[:]), "%d.%d", &major, &minor)
	return err == nil && (major > 6 || major == 6 && minor >= 12)
})

// Pin lets the sandbox at nsPath reach addrs for ttl: elements of its set
// (Policy.ResolvedSet) that lapse after it. An address already there gets
// the new timeout: on Linux 6.12 and later by adding it again (~0.2 ms);
// before, by deleting and adding it in the same batch, which the sandbox
// sees at once but which waits for a kernel grace period (~15 ms). A set
// that is not there (the pod was released) fails.
func Pin(nsPath, set string, addrs []netip.Addr, ttl time.Duration) error {
	var elems []nftables.SetElement
	for _, a := range addrs {
		if a = a.Unmap(); a.Is4() {
			k := a.As4()
			elems = append(elems, nftables.SetElement{Key: k[:], Timeout: ttl})
		}
	}
	if len(elems) == 0 {
		return nil
	}
	return batch(nsPath, func(b *builder) {
		s := &nftables.Set{Table: b.t, Name: set, KeyType: nftables.TypeIPAddr, HasTimeout: true}
		b.fail(b.c.SetAddElements(s, elems))
		if !addUpdatesTimeout() {
			// Added (a no-op if there), deleted, added with the new
			// timeout: a deletion waits for a kernel grace period.
			b.fail(b.c.SetDeleteElements(s, elems))
			b.fail(b.c.SetAddElements(s, elems))
		}
	})
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

func ifnameNot(key expr.MetaKey, name string) []expr.Any {
	e := ifname(key, name)
	e[1].(*expr.Cmp).Op = expr.CmpOpNeq
	return e
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

// loadAddr loads the IPv4 address at offset into register 1.
func loadAddr(offset uint32) []expr.Any {
	return []expr.Any{&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4}}
}

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

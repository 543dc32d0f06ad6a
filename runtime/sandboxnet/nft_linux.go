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
	accept := nftables.ChainPolicyAccept
	out := c.AddChain(&nftables.Chain{Name: "egress", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookOutput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	in := c.AddChain(&nftables.Chain{Name: "ingress", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	for _, r := range egressRules(p) {
		c.AddRule(&nftables.Rule{Table: t, Chain: out, Exprs: r})
	}
	for _, r := range ingressRules(p) {
		c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: r})
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("sandbox firewall: write the rules: %w", err)
	}
	return nil
}

func egressRules(p Policy) [][]expr.Any {
	rules := [][]expr.Any{
		cat(ifname(expr.MetaKeyOIFNAME, "lo"), verdict(expr.VerdictAccept)),
		cat(ctReplies(), verdict(expr.VerdictAccept)),
		cat(nfproto(unix.NFPROTO_IPV6), reject()),
	}
	for _, a := range p.Allow {
		rules = append(rules, cat(nfproto(unix.NFPROTO_IPV4), daddr(a), verdict(expr.VerdictAccept)))
	}
	for _, d := range p.Deny {
		rules = append(rules, cat(nfproto(unix.NFPROTO_IPV4), daddr(d), reject()))
	}
	switch {
	case !p.Internet:
		rules = append(rules, reject())
	case len(p.Only) > 0:
		for _, o := range p.Only {
			rules = append(rules, cat(nfproto(unix.NFPROTO_IPV4), daddr(o), verdict(expr.VerdictAccept)))
		}
		rules = append(rules, reject())
	}
	return rules
}

func ingressRules(p Policy) [][]expr.Any {
	rules := [][]expr.Any{
		cat(ifname(expr.MetaKeyIIFNAME, "lo"), verdict(expr.VerdictAccept)),
		cat(ctReplies(), verdict(expr.VerdictAccept)),
		cat(l4proto(unix.IPPROTO_ICMP), verdict(expr.VerdictAccept)),
	}
	for _, port := range p.TCPPorts {
		rules = append(rules, cat(l4proto(unix.IPPROTO_TCP), dport(port), verdict(expr.VerdictAccept)))
	}
	for _, port := range p.UDPPorts {
		rules = append(rules, cat(l4proto(unix.IPPROTO_UDP), dport(port), verdict(expr.VerdictAccept)))
	}
	return append(rules, reject())
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

// daddr matches an IPv4 destination in prefix (the header's bytes 16-19).
func daddr(prefix netip.Prefix) []expr.Any {
	addr := prefix.Masked().Addr().As4()
	mask := make([]byte, 4)
	binary.BigEndian.PutUint32(mask, ^uint32(0)<<(32-prefix.Bits()))
	if prefix.Bits() == 0 {
		mask = make([]byte, 4)
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: addr[:]},
	}
}

// dport matches a TCP or UDP destination port (after an l4proto match).
func dport(port uint16) []expr.Any {
	b := make([]byte, 2)
	binary.BigEndian.PutUint16(b, port)
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: b},
	}
}

package sandboxnet

import (
	"fmt"
	"net/netip"
	"strings"
)

// Policy is what one sandbox's network may do.
type Policy struct {
	// Internet lets the sandbox reach addresses not in Deny.
	Internet bool
	// Allow are reachable whatever Deny and Only say (the pool's
	// exceptions).
	Allow []netip.Prefix
	// Deny are never reachable unless in Allow.
	Deny []netip.Prefix
	// Only, when set, narrows internet egress to these prefixes (the pod's
	// sandman.io/egress).
	Only []netip.Prefix
	// TCPPorts and UDPPorts are open to inbound connections (the daemons'
	// ports and the pod's declared ports).
	TCPPorts []uint16
	UDPPorts []uint16
}

// SpecialRanges are never a sandbox's business: private networks (where
// pods, services, nodes and other sandboxes live), shared and link-local
// addresses (cloud metadata at 169.254.169.254), loopback, multicast and
// reserved ranges.
var SpecialRanges = mustPrefixes(
	"0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16",
	"172.16.0.0/12", "192.0.0.0/24", "192.168.0.0/16", "198.18.0.0/15", "224.0.0.0/4", "240.0.0.0/4",
)

// ParsePrefixes parses a comma-separated list of CIDRs or addresses (an
// address is its /32). Only IPv4 is accepted: sandboxes have no IPv6.
func ParsePrefixes(s string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		var p netip.Prefix
		var err error
		if strings.Contains(f, "/") {
			p, err = netip.ParsePrefix(f)
		} else {
			var a netip.Addr
			if a, err = netip.ParseAddr(f); err == nil {
				p = netip.PrefixFrom(a, a.BitLen())
			}
		}
		if err != nil {
			return nil, fmt.Errorf("%q is not a CIDR or an address", f)
		}
		if !p.Addr().Is4() {
			return nil, fmt.Errorf("%q: only IPv4 is supported (sandboxes have no IPv6)", f)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func mustPrefixes(s ...string) []netip.Prefix {
	out, err := ParsePrefixes(strings.Join(s, ","))
	if err != nil {
		panic(err)
	}
	return out
}

// Reaches reports whether the policy lets the sandbox open a connection to
// addr (what the rules do, for tests and for explaining a refusal).
func (p Policy) Reaches(addr netip.Addr) bool {
	in := func(ps []netip.Prefix) bool {
		for _, q := range ps {
			if q.Contains(addr) {
				return true
			}
		}
		return false
	}
	switch {
	case !addr.Is4():
		return false
	case in(p.Allow):
		return true
	case in(p.Deny), !p.Internet:
		return false
	case len(p.Only) > 0:
		return in(p.Only)
	}
	return true
}

package sandboxnet

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// firstDaemonPort is the daemon's port (api.Port; this package imports no
// sandman package): the node reaches it before any pod is bound.
const firstDaemonPort = 49983

// Policy is what one sandbox's network may do.
type Policy struct {
	// Internet lets the sandbox reach addresses not in Deny.
	Internet bool
	// Allow are reachable whatever Deny and Only say (the pool's
	// exceptions), unless in PodDeny.
	Allow []netip.Prefix
	// Deny are never reachable unless in Allow.
	Deny []netip.Prefix
	// Only, when set, narrows internet egress to these prefixes (the pod's
	// sandman.io/egress).
	Only []netip.Prefix
	// Resolver, when valid, is the node's DNS resolver for the pod's
	// allowed names (runtime/sandboxdns; Internet must be set): the
	// sandbox's DNS, UDP and TCP port 53 to any address, goes to it, the
	// only one of the node's addresses the sandbox reaches; and beside
	// Only, the addresses it pinned (Pin) into the set ResolvedSet pass.
	Resolver    netip.AddrPort
	ResolvedSet string
	// PodDeny are never reachable, whatever else says, Allow included
	// (the pod's sandman.io/egress-deny; sandman.io/egress: none is
	// 0.0.0.0/0): the pod's own narrowing, so it wins over the pool's
	// exceptions.
	PodDeny []netip.Prefix
	// Self are the node's addresses: they always reach the daemons' ports
	// (the agent's assignment and readiness, host-network components).
	Self []netip.Prefix
	// DaemonPorts are the pod's daemons' ports (49983 and up, one per
	// container).
	DaemonPorts []uint16
	// TCPPorts and UDPPorts are open to inbound connections (the daemons'
	// ports and the pod's declared ports), narrowed by IngressFrom.
	TCPPorts []uint16
	UDPPorts []uint16
	// IngressFrom, when not nil, narrows who may connect to the open ports:
	// a connection must match one of its rules (an empty, non-nil list
	// lets nobody in). The NetworkPolicies that select the pod, and who
	// may reach a sandbox by default, come here.
	IngressFrom []Rule
	// ControlPorts are TCP ports open to the control plane only: the
	// node's own addresses (Self) and ControlFrom, nobody else, whatever
	// IngressFrom says (the pod's sandman.io/control-ports, which
	// sandman-gateway sets so it can forward E2B's getHost traffic to any
	// port of its sandboxes). Proto is ignored; a rule per range.
	ControlPorts []PortRange
	// ControlFrom are the control namespaces' pods (the gateway's among
	// them) that reach ControlPorts besides Self; nil with no
	// NetworkPolicy engine, which knows them.
	ControlFrom []netip.Prefix
	// EgressTo, when not nil, narrows egress further: a connection must
	// match one of its rules and then pass the pool's rules above (the
	// pod's egress NetworkPolicies).
	EgressTo []Rule
}

// Rule lets connections from (ingress) or to (egress) any of Peers on any
// of Ports. No peers: any address; no ports: any port.
type Rule struct {
	Peers []Peer
	Ports []PortRange
}

// Peer is an address range less some of its parts (a NetworkPolicy
// ipBlock; a pod is its address's /32).
type Peer struct {
	Prefix netip.Prefix
	Except []netip.Prefix
}

// PortRange is Port, or Port to EndPort, of Proto ("TCP" or "UDP").
type PortRange struct {
	Proto   string
	Port    uint16
	EndPort uint16
}

func (r Rule) matches(addr netip.Addr, proto string, port uint16) bool {
	peer := len(r.Peers) == 0
	for _, p := range r.Peers {
		if p.Prefix.Contains(addr) && !containsAny(p.Except, addr) {
			peer = true
		}
	}
	ok := len(r.Ports) == 0
	for _, pr := range r.Ports {
		if pr.Proto == proto && (port == pr.Port || (pr.EndPort > 0 && port >= pr.Port && port <= pr.EndPort)) {
			ok = true
		}
	}
	return peer && ok
}

func containsAny(ps []netip.Prefix, addr netip.Addr) bool {
	for _, q := range ps {
		if q.Contains(addr) {
			return true
		}
	}
	return false
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
// addr:port over proto (what the rules do, for tests and explanations).
func (p Policy) Reaches(addr netip.Addr, proto string, port uint16) bool {
	if p.Resolver.IsValid() && addr == p.Resolver.Addr() && port == p.Resolver.Port() {
		return true
	}
	if !addr.Is4() || containsAny(p.PodDeny, addr) {
		return false
	}
	if p.EgressTo != nil && !anyMatches(p.EgressTo, addr, proto, port) {
		return false
	}
	switch {
	case containsAny(p.Allow, addr):
		return true
	case containsAny(p.Deny, addr), !p.Internet:
		return false
	case len(p.Only) > 0 || p.Resolver.IsValid():
		// The resolver's pinned addresses are not known here.
		return containsAny(p.Only, addr)
	}
	return true
}

// Admits reports whether the policy lets a connection from addr in to
// port over proto.
func (p Policy) Admits(addr netip.Addr, proto string, port uint16) bool {
	if proto == "TCP" && (port == firstDaemonPort || slices.Contains(p.DaemonPorts, port)) && containsAny(p.Self, addr) {
		return true
	}
	if proto == "TCP" && inRanges(p.ControlPorts, port) && (containsAny(p.Self, addr) || containsAny(p.ControlFrom, addr)) {
		return true
	}
	open := p.TCPPorts
	if proto == "UDP" {
		open = p.UDPPorts
	}
	for _, o := range open {
		if o == port {
			return p.IngressFrom == nil || anyMatches(p.IngressFrom, addr, proto, port)
		}
	}
	return false
}

func inRanges(rs []PortRange, port uint16) bool {
	for _, r := range rs {
		if port == r.Port || (r.EndPort > r.Port && port >= r.Port && port <= r.EndPort) {
			return true
		}
	}
	return false
}

// ParsePorts parses a comma-separated list of TCP ports and ranges
// ("8000", "1024-65535") into port ranges, in order.
func ParsePorts(s string) ([]PortRange, error) {
	var out []PortRange
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(f, "-")
		a, err := parsePort(lo)
		b := a
		if err == nil && isRange {
			b, err = parsePort(hi)
		}
		if err != nil || b < a {
			return nil, fmt.Errorf("%q is not a port (1-65535) or a range of them (such as 1024-65535)", f)
		}
		r := PortRange{Proto: "TCP", Port: a}
		if b > a {
			r.EndPort = b
		}
		out = append(out, r)
	}
	return out, nil
}

func parsePort(s string) (uint16, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 16)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("bad port %q", s)
	}
	return uint16(n), nil
}

func anyMatches(rules []Rule, addr netip.Addr, proto string, port uint16) bool {
	for _, r := range rules {
		if r.matches(addr, proto, port) {
			return true
		}
	}
	return false
}

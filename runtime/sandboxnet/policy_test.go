package sandboxnet

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

func TestParsePrefixes(t *testing.T) {
	for _, tc := range []struct {
		in, want, err string
	}{
		{in: "", want: "[]"},
		{in: "10.1.2.3", want: "[10.1.2.3/32]"},
		{in: " 203.0.113.9/24 , 1.1.1.1", want: "[203.0.113.0/24 1.1.1.1/32]"},
		{in: "nope", err: `"nope" is not a CIDR or an address`},
		{in: "2001:db8::/32", err: "only IPv4"},
		{in: "1.2.3.4/40", err: "is not a CIDR"},
	} {
		got, err := ParsePrefixes(tc.in)
		switch {
		case tc.err != "" && (err == nil || !contains(err.Error(), tc.err)):
			t.Errorf("ParsePrefixes(%q): %v, want an error with %q", tc.in, err, tc.err)
		case tc.err == "" && (err != nil || fmtPrefixes(got) != tc.want):
			t.Errorf("ParsePrefixes(%q) = %v %v, want %s", tc.in, got, err, tc.want)
		}
	}
}

// TestReaches: the order the rules apply — PodDeny, Allow, Deny, no
// internet, Only.
func TestReaches(t *testing.T) {
	allow := mustPrefixes("10.96.0.10/32")
	only := mustPrefixes("203.0.113.0/24")
	none := mustPrefixes("0.0.0.0/0")
	for _, tc := range []struct {
		name  string
		p     Policy
		addr  string
		reach bool
	}{
		{"private range", Policy{Internet: true, Deny: SpecialRanges}, "10.1.2.3", false},
		{"metadata", Policy{Internet: true, Deny: SpecialRanges}, "169.254.169.254", false},
		{"public with internet", Policy{Internet: true, Deny: SpecialRanges}, "8.8.8.8", true},
		{"public without internet", Policy{Deny: SpecialRanges}, "8.8.8.8", false},
		{"allowed exception in a denied range", Policy{Allow: allow, Deny: SpecialRanges}, "10.96.0.10", true},
		{"only narrows", Policy{Internet: true, Deny: SpecialRanges, Only: only}, "8.8.8.8", false},
		{"only passes its own", Policy{Internet: true, Deny: SpecialRanges, Only: only}, "203.0.113.5", true},
		{"only never widens deny", Policy{Internet: true, Deny: SpecialRanges, Only: mustPrefixes("10.0.0.0/8")}, "10.1.2.3", false},
		{"only never widens no internet", Policy{Deny: SpecialRanges, Only: only}, "203.0.113.5", false},
		{"IPv6", Policy{Internet: true}, "2001:db8::1", false},
		{"pod deny narrows internet", Policy{Internet: true, Deny: SpecialRanges, PodDeny: only}, "203.0.113.5", false},
		{"pod deny leaves the rest", Policy{Internet: true, Deny: SpecialRanges, PodDeny: only}, "8.8.8.8", true},
		{"pod deny wins over the pool's allow", Policy{Allow: allow, Deny: SpecialRanges, PodDeny: mustPrefixes("10.96.0.0/16")}, "10.96.0.10", false},
		{"pod deny elsewhere keeps the pool's allow", Policy{Allow: allow, Deny: SpecialRanges, PodDeny: only}, "10.96.0.10", true},
		{"pod deny wins over only", Policy{Internet: true, Deny: SpecialRanges, Only: only, PodDeny: mustPrefixes("203.0.113.5")}, "203.0.113.5", false},
		{"only beside a pod deny", Policy{Internet: true, Deny: SpecialRanges, Only: only, PodDeny: mustPrefixes("203.0.113.5")}, "203.0.113.6", true},
		{"pod deny never widens no internet", Policy{Deny: SpecialRanges, PodDeny: only}, "8.8.8.8", false},
		{"no egress: the internet", Policy{Internet: true, Deny: SpecialRanges, PodDeny: none}, "8.8.8.8", false},
		{"no egress: the pool's allow", Policy{Internet: true, Allow: allow, Deny: SpecialRanges, PodDeny: none}, "10.96.0.10", false},
		{"no egress: what the pod listed", Policy{Internet: true, Deny: SpecialRanges, Only: only, PodDeny: none}, "203.0.113.5", false},
		{"no egress: what its NetworkPolicy allows", Policy{Internet: true, Deny: SpecialRanges, PodDeny: none,
			EgressTo: []Rule{{Peers: []Peer{{Prefix: only[0]}}}}}, "203.0.113.5", false},
	} {
		if got := tc.p.Reaches(netip.MustParseAddr(tc.addr), "TCP", 443); got != tc.reach {
			t.Errorf("%s: Reaches(%s) = %v, want %v", tc.name, tc.addr, got, tc.reach)
		}
	}
}

// TestPoolRules: the pool chain ends in a verdict on every path, with one
// rule per listed prefix; with internet, the pod's narrowing (pod_only) is
// asked before the final accept.
func TestPoolRules(t *testing.T) {
	p := Policy{Allow: mustPrefixes("10.96.0.10"), Deny: SpecialRanges}
	if got, want := len(poolRules(p)), 1+len(SpecialRanges)+1; got != want {
		t.Errorf("pool rules without internet: %d, want %d (ending in reject)", got, want)
	}
	p.Internet = true
	if got, want := len(poolRules(p)), 1+len(SpecialRanges)+2; got != want {
		t.Errorf("pool rules with internet: %d, want %d (pod_only, then accept)", got, want)
	}
}

// TestRules: NetworkPolicy-style rules narrow ingress and egress.
func TestRules(t *testing.T) {
	trainer := netip.MustParseAddr("10.244.1.5")
	other := netip.MustParseAddr("10.244.2.9")
	p := Policy{
		Internet: true, Deny: SpecialRanges, TCPPorts: []uint16{49983, 8080},
		IngressFrom: []Rule{
			{Peers: []Peer{{Prefix: netip.PrefixFrom(trainer, 32)}}},
			{Peers: []Peer{{Prefix: mustPrefixes("10.244.0.0/16")[0], Except: mustPrefixes("10.244.2.0/24")}}, Ports: []PortRange{{Proto: "TCP", Port: 8000, EndPort: 8100}}},
		},
		EgressTo: []Rule{{Peers: []Peer{{Prefix: mustPrefixes("203.0.113.0/24")[0]}}, Ports: []PortRange{{Proto: "TCP", Port: 443}}}},
	}
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"trainer to the daemon", p.Admits(trainer, "TCP", 49983)},
		{"trainer to 8080", p.Admits(trainer, "TCP", 8080)},
		{"range peer to 8080 (in its port range)", p.Admits(netip.MustParseAddr("10.244.3.3"), "TCP", 8080)},
	} {
		if !tc.ok {
			t.Errorf("%s: refused, want admitted", tc.name)
		}
	}
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"excepted peer", p.Admits(other, "TCP", 8080)},
		{"range peer to the daemon (outside its ports)", p.Admits(netip.MustParseAddr("10.244.3.3"), "TCP", 49983)},
		{"trainer to an unopened port", p.Admits(trainer, "TCP", 22)},
		{"egress on another port", p.Reaches(netip.MustParseAddr("203.0.113.5"), "TCP", 80)},
		{"egress to an address no rule lists", p.Reaches(netip.MustParseAddr("8.8.8.8"), "TCP", 443)},
	} {
		if tc.ok {
			t.Errorf("%s: admitted, want refused", tc.name)
		}
	}
	if !p.Reaches(netip.MustParseAddr("203.0.113.5"), "TCP", 443) {
		t.Errorf("egress a rule allows, within the pool's: refused")
	}
	p.IngressFrom = []Rule{}
	if p.Admits(trainer, "TCP", 49983) {
		t.Errorf("an empty, non-nil IngressFrom admitted a connection")
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func fmtPrefixes(ps []netip.Prefix) string { return fmt.Sprint(ps) }

// TestControlPorts: the control plane's ports admit the node's addresses
// and the control pods, nobody else, whatever IngressFrom says; the pod's
// own ports are as before.
func TestControlPorts(t *testing.T) {
	node := netip.MustParseAddr("10.0.0.1")
	gateway := netip.MustParseAddr("10.244.9.9")
	trainer := netip.MustParseAddr("10.244.1.5")
	ports, err := ParsePorts("1-49982, 49984-65535")
	if err != nil {
		t.Fatal(err)
	}
	for _, ingress := range [][]Rule{nil, {{Peers: []Peer{{Prefix: netip.PrefixFrom(trainer, 32)}}}}} {
		p := Policy{Self: mustPrefixes("10.0.0.1"), TCPPorts: []uint16{49983, 9000}, ControlPorts: ports,
			ControlFrom: mustPrefixes("10.244.9.9"), IngressFrom: ingress}
		for _, tc := range []struct {
			name string
			got  bool
			want bool
		}{
			{"node to 8000", p.Admits(node, "TCP", 8000), true},
			{"gateway to 8000", p.Admits(gateway, "TCP", 8000), true},
			{"gateway to 65535", p.Admits(gateway, "TCP", 65535), true},
			{"trainer to 8000 (a control port only)", p.Admits(trainer, "TCP", 8000), false},
			{"gateway to 8000 over UDP", p.Admits(gateway, "UDP", 8000), false},
			{"trainer to its declared 9000", p.Admits(trainer, "TCP", 9000), true},
		} {
			if tc.got != tc.want {
				t.Errorf("IngressFrom %v: %s: admitted %v, want %v", ingress, tc.name, tc.got, tc.want)
			}
		}
	}
}

func TestParsePorts(t *testing.T) {
	got, err := ParsePorts(" 8000,1024-2048 ,")
	want := []PortRange{{Proto: "TCP", Port: 8000}, {Proto: "TCP", Port: 1024, EndPort: 2048}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("ParsePorts = %v, %v; want %v", got, err, want)
	}
	for _, bad := range []string{"0", "65536", "9-8", "x", "1-", "-5", "80/udp"} {
		if _, err := ParsePorts(bad); err == nil {
			t.Errorf("ParsePorts(%q) = nil error", bad)
		}
	}
}

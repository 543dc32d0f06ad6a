package sandboxnet

import (
	"fmt"
	"net/netip"
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

// TestReaches: the order the rules apply — Allow, Deny, no internet, Only.
func TestReaches(t *testing.T) {
	allow := mustPrefixes("10.96.0.10/32")
	only := mustPrefixes("203.0.113.0/24")
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
	} {
		if got := tc.p.Reaches(netip.MustParseAddr(tc.addr)); got != tc.reach {
			t.Errorf("%s: Reaches(%s) = %v, want %v", tc.name, tc.addr, got, tc.reach)
		}
	}
}

// TestRulesFollowPolicy: the rule list ends in a reject exactly when the
// policy stops at something, and has one rule per listed prefix and port.
func TestRulesFollowPolicy(t *testing.T) {
	p := Policy{Allow: mustPrefixes("10.96.0.10"), Deny: SpecialRanges, TCPPorts: []uint16{49983, 8080}, UDPPorts: []uint16{53}}
	// lo, replies, IPv6, allow, deny..., no internet.
	if got, want := len(egressRules(p)), 3+1+len(SpecialRanges)+1; got != want {
		t.Errorf("egress rules without internet: %d, want %d", got, want)
	}
	p.Internet = true
	if got, want := len(egressRules(p)), 3+1+len(SpecialRanges); got != want {
		t.Errorf("egress rules with internet: %d, want %d (no final reject)", got, want)
	}
	p.Only = mustPrefixes("203.0.113.0/24", "198.51.100.0/24")
	if got, want := len(egressRules(p)), 3+1+len(SpecialRanges)+2+1; got != want {
		t.Errorf("egress rules narrowed: %d, want %d", got, want)
	}
	// lo, replies, ICMP, 2 TCP, 1 UDP, reject.
	if got := len(ingressRules(p)); got != 7 {
		t.Errorf("ingress rules: %d, want 7", got)
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func fmtPrefixes(ps []netip.Prefix) string { return fmt.Sprint(ps) }

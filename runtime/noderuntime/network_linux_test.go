package noderuntime

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/sandboxnet"
)

// TestPolicyEgress: a pod's egress list and denied ranges become its
// slot's firewall, and only narrow the pool's: a list on a pool without
// internet egress is refused, denied ranges are taken on any pool and win
// over the pool's exceptions. The request kept for later rewrites (a
// NetworkPolicy change) keeps both.
func TestPolicyEgress(t *testing.T) {
	const (
		proxy     = "10.96.0.10"   // the pool's exception, in a denied range
		public    = "203.0.113.5"  // the pod's listed network
		elsewhere = "198.51.100.7" // another public address
		gateway   = "10.88.0.1"    // the node on the slot network
		resolver  = gateway        // on fakeResolver's port
	)
	type reach map[string]bool
	for _, tc := range []struct {
		name                  string
		internet, noDNS       bool
		egress, deny, domains []string
		refused               string // "": accepted
		want                  reach
	}{
		// The resolver's addresses are the node's: reachable on its port
		// alone; what names resolve to is pinned at run time, not here.
		{name: "names", internet: true, domains: []string{"api.example.com"},
			want: reach{proxy: true, public: false, elsewhere: false, resolver: true}},
		{name: "names beside a list", internet: true, egress: []string{"203.0.113.0/24"}, domains: []string{"api.example.com"},
			want: reach{proxy: true, public: true, elsewhere: false, resolver: true}},
		{name: "names, denied", internet: true, domains: []string{"api.example.com"}, deny: []string{"0.0.0.0/0"},
			want: reach{proxy: false, public: false, resolver: true}},
		{name: "names on a pool without egress", domains: []string{"api.example.com"}, refused: "no internet egress"},
		{name: "names on a node without a resolver", internet: true, noDNS: true, domains: []string{"api.example.com"}, refused: "--dns-listen"},
		{name: "pool without egress", want: reach{proxy: true, public: false, elsewhere: false}},
		{name: "pool with egress", internet: true, want: reach{proxy: true, public: true, elsewhere: true}},
		{name: "narrowed", internet: true, egress: []string{"203.0.113.0/24"}, want: reach{proxy: true, public: true, elsewhere: false}},
		{name: "narrowed on a pool without egress", egress: []string{"203.0.113.0/24"}, refused: "no internet egress"},
		{name: "denied", internet: true, deny: []string{"203.0.113.0/24"}, want: reach{proxy: true, public: false, elsewhere: true}},
		{name: "denied beside the list", internet: true, egress: []string{"203.0.113.0/24", "198.51.100.0/24"}, deny: []string{"198.51.100.7/32"},
			want: reach{proxy: true, public: true, elsewhere: false}},
		{name: "denied on a pool without egress", deny: []string{"203.0.113.0/24"}, want: reach{proxy: true, public: false, elsewhere: false}},
		{name: "the pool's exception denied", deny: []string{proxy + "/32"}, want: reach{proxy: false, public: false, elsewhere: false}},
		{name: "no egress", internet: true, deny: []string{"0.0.0.0/0"}, want: reach{proxy: false, public: false, elsewhere: false}},
		{name: "no egress on a pool without egress", deny: []string{"0.0.0.0/0"}, want: reach{proxy: false, public: false, elsewhere: false}},
		{name: "malformed deny", deny: []string{"nope"}, refused: "egress deny"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Runtime{cfg: Config{EgressInternet: tc.internet, EgressAllow: []netip.Prefix{netip.MustParsePrefix(proxy + "/32")}},
				deny: sandboxnet.SpecialRanges, routeSrc: func(netip.Addr) (netip.Addr, error) { return netip.MustParseAddr(gateway), nil }}
			if !tc.noDNS {
				r.cfg.DNS = fakeResolver{}
			}
			req := runtime.BindRequest{Pod: runtime.PodRef{UID: "u1", Namespace: "ns", Name: "p"},
				Containers: []runtime.ContainerSpec{{Name: "main", Image: "img"}}, Egress: tc.egress, EgressDeny: tc.deny, EgressDomains: tc.domains}
			p, err := r.policy(&req, "10.88.0.5")
			if tc.refused != "" {
				if err == nil || !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("policy: %v, want InvalidArgument saying %q", err, tc.refused)
				}
				return
			}
			if err != nil {
				t.Fatalf("policy: %v", err)
			}
			// What a NetworkPolicy change writes again is the same policy.
			again, err := r.policy(firewallRequest(req), "10.88.0.5")
			if err != nil {
				t.Fatalf("policy of the kept request: %v", err)
			}
			if !slices.Equal(p.PodDeny, again.PodDeny) || !slices.Equal(p.Only, again.Only) || p.Resolver != again.Resolver || p.ResolvedSet != again.ResolvedSet {
				t.Errorf("the kept request's policy denies %v, narrows to %v, resolves at %v; want %v, %v, %v", again.PodDeny, again.Only, again.Resolver, p.PodDeny, p.Only, p.Resolver)
			}
			if len(tc.domains) > 0 && p.ResolvedSet != "resolved_u1" {
				t.Errorf("pinned addresses go to set %q, want resolved_u1", p.ResolvedSet)
			}
			for addr, want := range tc.want {
				port := uint16(443)
				if addr == resolver {
					port = 5300
				}
				if got := p.Reaches(netip.MustParseAddr(addr), "UDP", port); got != want {
					t.Errorf("reaches %s:%d: %v, want %v", addr, port, got, want)
				}
			}
		})
	}
}

// fakeResolver is a node resolver on port 5300 that forgets what it is told.
type fakeResolver struct{}

func (fakeResolver) Port() uint16 { return 5300 }
func (fakeResolver) Register(netip.Addr, []string, func([]netip.Addr, time.Duration) error) error {
	return nil
}
func (fakeResolver) Unregister(netip.Addr) {}

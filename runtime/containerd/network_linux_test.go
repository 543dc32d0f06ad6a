package containerd

import (
	"net/netip"
	"slices"
	"strings"
	"testing"

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
	)
	type reach map[string]bool
	for _, tc := range []struct {
		name         string
		internet     bool
		egress, deny []string
		refused      string // "": accepted
		want         reach
	}{
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
				deny: sandboxnet.SpecialRanges}
			req := runtime.BindRequest{Pod: runtime.PodRef{UID: "u1", Namespace: "ns", Name: "p"},
				Containers: []runtime.ContainerSpec{{Name: "main", Image: "img"}}, Egress: tc.egress, EgressDeny: tc.deny}
			p, err := r.policy(&req)
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
			again, err := r.policy(firewallRequest(req))
			if err != nil {
				t.Fatalf("policy of the kept request: %v", err)
			}
			if !slices.Equal(p.PodDeny, again.PodDeny) || !slices.Equal(p.Only, again.Only) {
				t.Errorf("the kept request's policy denies %v and narrows to %v, want %v and %v", again.PodDeny, again.Only, p.PodDeny, p.Only)
			}
			for addr, want := range tc.want {
				if got := p.Reaches(netip.MustParseAddr(addr), "TCP", 443); got != want {
					t.Errorf("reaches %s: %v, want %v", addr, got, want)
				}
			}
		})
	}
}

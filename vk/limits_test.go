package vk

import (
	"strings"
	"testing"

	"github.com/sandman-dev/sandman/podcontract"
)

// TestPoolBandwidth: a pod's bandwidth annotations reach the node agent
// within the pool's maximum; one above it is refused naming the
// annotation, the amount and the maximum; a pod without them gets the
// pool's default, or its maximum when it has no default, so every sandbox
// is bounded once the pool has either.
func TestPoolBandwidth(t *testing.T) {
	for _, tc := range []struct {
		name            string
		def, ceiling    Bandwidth
		ingress, egress string // annotations ("": none)
		wantIn, wantOut int64
		err             string
	}{
		{name: "no pool caps, none asked"},
		{name: "no pool caps, asked", ingress: "10M", egress: "20M", wantIn: 10e6, wantOut: 20e6},
		{name: "default", def: Bandwidth{100e6, 50e6}, ceiling: Bandwidth{1e9, 1e9}, wantIn: 100e6, wantOut: 50e6},
		{name: "maximum without a default", ceiling: Bandwidth{1e9, 200e6}, wantIn: 1e9, wantOut: 200e6},
		{name: "one way asked, the other defaulted", def: Bandwidth{100e6, 100e6}, egress: "1M", wantIn: 100e6, wantOut: 1e6},
		{name: "at the maximum", ceiling: Bandwidth{1e9, 1e9}, ingress: "1G", egress: "1G", wantIn: 1e9, wantOut: 1e9},
		{name: "above the maximum", def: Bandwidth{100e6, 100e6}, ceiling: Bandwidth{1e9, 1e9}, egress: "2G",
			err: "annotation kubernetes.io/egress-bandwidth: 2G is above the maximum 1G of pool vn"},
		{name: "malformed", ingress: "fast", err: `annotation kubernetes.io/ingress-bandwidth: "fast"`},
		{name: "below what a node caps", ingress: "10", err: "from 1k to 32G"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := testPod("p", "img")
			if tc.ingress != "" {
				pod.Annotations[podcontract.AnnotationIngressBandwidth] = tc.ingress
			}
			if tc.egress != "" {
				pod.Annotations[podcontract.AnnotationEgressBandwidth] = tc.egress
			}
			req, err := translator(func(c *Config) { c.DefaultBandwidth, c.MaxBandwidth = tc.def, tc.ceiling }).bindRequest(pod)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if req.IngressBandwidth != tc.wantIn || req.EgressBandwidth != tc.wantOut {
				t.Fatalf("ingress %d egress %d, want %d %d", req.IngressBandwidth, req.EgressBandwidth, tc.wantIn, tc.wantOut)
			}
		})
	}
}

func TestCheckPoolBandwidth(t *testing.T) {
	for _, tc := range []struct {
		def, ceiling Bandwidth
		err          string
	}{
		{Bandwidth{}, Bandwidth{}, ""},
		{Bandwidth{100e6, 100e6}, Bandwidth{1e9, 1e9}, ""},
		{Bandwidth{100e6, 0}, Bandwidth{0, 1e9}, ""},
		{Bandwidth{2e9, 0}, Bandwidth{1e9, 0}, "default ingress bandwidth 2G is above the maximum 1G"},
		{Bandwidth{0, 2e9}, Bandwidth{0, 1e9}, "default egress bandwidth 2G is above the maximum 1G"},
		{Bandwidth{}, Bandwidth{Egress: 100}, "maximum egress bandwidth 100"},
		{Bandwidth{Ingress: 64e9}, Bandwidth{}, "default ingress bandwidth 64G"},
	} {
		err := checkPoolBandwidth(tc.def, tc.ceiling)
		if (tc.err == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("checkPoolBandwidth(%v, %v) = %v, want %q", tc.def, tc.ceiling, err, tc.err)
		}
	}
}

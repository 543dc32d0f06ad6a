package vk

import (
	"slices"
	"strings"
	"testing"

	"github.com/sandman-dev/sandman/podcontract"
)

// TestEgressAnnotations: sandman.io/egress narrows the sandbox's internet
// egress to its CIDRs, or with none takes it all away (a pod-level deny of
// 0.0.0.0/0, which wins over the pool's exceptions); sandman.io/egress-deny
// adds the pod's own denied ranges; sandman.io/egress-domains its allowed
// DNS names. Each is normalised (CIDRs masked, an address its /32; names
// trimmed, lowercased, without a trailing dot) into a request the node
// accepts, or refused naming the annotation.
func TestEgressAnnotations(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		annotations           map[string]string
		egress, deny, domains []string
		refused               string // "": accepted
	}{
		{name: "neither"},
		{name: "narrowed", annotations: map[string]string{podcontract.AnnotationEgress: "203.0.113.9/24, 198.51.100.7"},
			egress: []string{"203.0.113.0/24", "198.51.100.7/32"}},
		{name: "none", annotations: map[string]string{podcontract.AnnotationEgress: "none"}, deny: []string{"0.0.0.0/0"}},
		{name: "none spelt loosely", annotations: map[string]string{podcontract.AnnotationEgress: " None "}, deny: []string{"0.0.0.0/0"}},
		{name: "denied", annotations: map[string]string{podcontract.AnnotationEgressDeny: "10.96.0.10, 203.0.113.0/24"},
			deny: []string{"10.96.0.10/32", "203.0.113.0/24"}},
		{name: "narrowed and denied", annotations: map[string]string{podcontract.AnnotationEgress: "203.0.113.0/24", podcontract.AnnotationEgressDeny: "203.0.113.7"},
			egress: []string{"203.0.113.0/24"}, deny: []string{"203.0.113.7/32"}},
		{name: "none and denied", annotations: map[string]string{podcontract.AnnotationEgress: "none", podcontract.AnnotationEgressDeny: "1.1.1.1"},
			deny: []string{"0.0.0.0/0", "1.1.1.1/32"}},
		{name: "empty egress", annotations: map[string]string{podcontract.AnnotationEgress: ""}, refused: podcontract.AnnotationEgress + ": it lists nothing"},
		{name: "none among CIDRs", annotations: map[string]string{podcontract.AnnotationEgress: "none,1.1.1.1"}, refused: podcontract.AnnotationEgress + `: "none" is not a CIDR`},
		{name: "IPv6 egress", annotations: map[string]string{podcontract.AnnotationEgress: "2001:db8::/32"}, refused: podcontract.AnnotationEgress + `: "2001:db8::/32": only IPv4`},
		{name: "empty deny", annotations: map[string]string{podcontract.AnnotationEgressDeny: " , "}, refused: podcontract.AnnotationEgressDeny + ": it lists nothing"},
		{name: "none as a deny", annotations: map[string]string{podcontract.AnnotationEgressDeny: "none"}, refused: podcontract.AnnotationEgressDeny + `: "none" is not a CIDR`},
		{name: "IPv6 deny", annotations: map[string]string{podcontract.AnnotationEgressDeny: "::1"}, refused: podcontract.AnnotationEgressDeny + `: "::1": only IPv4`},
		{name: "names", annotations: map[string]string{podcontract.AnnotationEgressDomains: " API.example.com., *.pypi.org ,"},
			domains: []string{"api.example.com", "*.pypi.org"}},
		{name: "names and CIDRs", annotations: map[string]string{podcontract.AnnotationEgress: "203.0.113.0/24", podcontract.AnnotationEgressDomains: "api.example.com"},
			egress: []string{"203.0.113.0/24"}, domains: []string{"api.example.com"}},
		{name: "empty names", annotations: map[string]string{podcontract.AnnotationEgressDomains: " , "}, refused: podcontract.AnnotationEgressDomains + ": it lists nothing"},
		{name: "a wildcard inside", annotations: map[string]string{podcontract.AnnotationEgressDomains: "a.*.example.com"}, refused: podcontract.AnnotationEgressDomains + `: name "a.*.example.com"`},
		{name: "an address as a name", annotations: map[string]string{podcontract.AnnotationEgressDomains: "203.0.113.7"}, refused: podcontract.AnnotationEgressDomains + `: name "203.0.113.7": is an address`},
		{name: "a URL", annotations: map[string]string{podcontract.AnnotationEgressDomains: "https://example.com"}, refused: podcontract.AnnotationEgressDomains + `: name "https://example.com"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := testPod("p", "img")
			for k, v := range tc.annotations {
				pod.Annotations[k] = v
			}
			req, err := translator().bindRequest(pod)
			if tc.refused != "" {
				if err == nil || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("bindRequest: %v, want an error saying %q", err, tc.refused)
				}
				return
			}
			if err != nil {
				t.Fatalf("bindRequest: %v", err)
			}
			if !slices.Equal(req.Egress, tc.egress) || !slices.Equal(req.EgressDeny, tc.deny) || !slices.Equal(req.EgressDomains, tc.domains) {
				t.Errorf("egress %q, deny %q, domains %q; want %q, %q, %q", req.Egress, req.EgressDeny, req.EgressDomains, tc.egress, tc.deny, tc.domains)
			}
			if err := req.Validate(); err != nil {
				t.Errorf("the node would refuse the request: %v", err)
			}
		})
	}
}

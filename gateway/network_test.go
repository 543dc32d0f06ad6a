package gateway

import (
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/sandman-dev/sandman/podcontract"
)

func TestEgressAnnotations(t *testing.T) {
	off, on := false, true
	for _, tc := range []struct {
		name     string
		internet *bool
		allow    []string
		deny     []string
		want     map[string]string // nil: no annotation
		err      string            // a 400 saying this
	}{
		{name: "nothing asked"},
		{name: "internet on", internet: &on},
		{name: "internet off", internet: &off, want: map[string]string{podcontract.AnnotationEgress: "none"}},
		{name: "deny all", deny: []string{"0.0.0.0/0"}, want: map[string]string{podcontract.AnnotationEgress: "none"}},
		{name: "internet on but deny all", internet: &on, deny: []string{"0.0.0.0/0"}, want: map[string]string{podcontract.AnnotationEgress: "none"}},
		{name: "deny all, allow some", deny: []string{"0.0.0.0/0", "8.8.8.0/24"}, allow: []string{"8.8.8.8", "1.1.1.0/24", "1.1.1.1/24"},
			want: map[string]string{podcontract.AnnotationEgress: "1.1.1.0/24,8.8.8.8/32"}},
		{name: "internet off, allow some", internet: &off, allow: []string{" 203.0.113.7 "}, want: map[string]string{podcontract.AnnotationEgress: "203.0.113.7/32"}},
		{name: "internet off, allow all", internet: &off, allow: []string{"0.0.0.0/0"}, want: map[string]string{podcontract.AnnotationEgress: "0.0.0.0/0"}},
		{name: "deny some", deny: []string{"9.9.9.9", "198.51.100.0/24", "9.9.9.9/32"}, want: map[string]string{podcontract.AnnotationEgressDeny: "9.9.9.9/32,198.51.100.0/24"}},
		{name: "deny some, allow others", deny: []string{"198.51.100.0/24"}, allow: []string{"203.0.113.0/24"}, want: map[string]string{podcontract.AnnotationEgressDeny: "198.51.100.0/24"}},
		{name: "an allow covering a deny wins", deny: []string{"198.51.100.0/25", "9.9.9.9"}, allow: []string{"198.51.100.0/24"}, want: map[string]string{podcontract.AnnotationEgressDeny: "9.9.9.9/32"}},
		{name: "an allow equal to the deny wins", deny: []string{"198.51.100.0/24"}, allow: []string{"198.51.100.0/24"}},
		{name: "an allow inside a deny", deny: []string{"198.51.100.0/24"}, allow: []string{"198.51.100.7"}, err: "lies inside denyOut 198.51.100.0/24"},
		{name: "an IPv6 deny is already so", deny: []string{"2001:db8::/32"}},
		{name: "an IPv4-mapped address", deny: []string{"::ffff:9.9.9.9"}, want: map[string]string{podcontract.AnnotationEgressDeny: "9.9.9.9/32"}},
		{name: "an IPv6 allow", internet: &off, allow: []string{"2001:db8::1"}, err: "sandboxes have no IPv6"},
		{name: "domains to allow", deny: []string{"0.0.0.0/0"}, allow: []string{"API.example.com.", "*.pypi.org", "api.example.com"},
			want: map[string]string{podcontract.AnnotationEgressDomains: "*.pypi.org,api.example.com"}},
		{name: "internet off, domains and addresses", internet: &off, allow: []string{"pypi.org", "203.0.113.7"},
			want: map[string]string{podcontract.AnnotationEgress: "203.0.113.7/32", podcontract.AnnotationEgressDomains: "pypi.org"}},
		{name: "a domain while the internet is open", allow: []string{"*.example.com"}, err: "add 0.0.0.0/0 (ALL_TRAFFIC) to denyOut"},
		{name: "a domain to deny", deny: []string{"example.com"}, err: "network.denyOut"},
		{name: "a single label is no domain", deny: []string{"0.0.0.0/0"}, allow: []string{"localhost"}, err: "not an IP address, CIDR or domain name"},
		{name: "not an address", allow: []string{"10.0.0.0/33"}, err: "not an IP address, CIDR or domain name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var n *networkConfig
			if tc.allow != nil || tc.deny != nil {
				n = &networkConfig{AllowOut: tc.allow, DenyOut: tc.deny}
			}
			got, err := egressAnnotations(tc.internet, n)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) || httpStatus(err) != http.StatusBadRequest {
					t.Fatalf("got %v, %v; want a 400 saying %q", got, err, tc.err)
				}
				return
			}
			if err != nil || !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("got %v, %v; want %v", got, err, tc.want)
			}
		})
	}
}

// A create's network settings reach the pod as the node's egress
// annotations; a domain rule the node could not honour is refused before
// any pod is made.
func TestCreateEgress(t *testing.T) {
	e := newEnv(t)
	_, pod := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base", "allow_internet_access": false,
		"network": map[string]any{"allowOut": []string{"203.0.113.7"}}})
	if got := pod.Annotations[podcontract.AnnotationEgress]; got != "203.0.113.7/32" {
		t.Fatalf("%s = %q", podcontract.AnnotationEgress, got)
	}
	if got := pod.Annotations[podcontract.AnnotationE2BInternet]; got != "false" {
		t.Fatalf("%s = %q", podcontract.AnnotationE2BInternet, got)
	}
	_, pod = e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base", "network": map[string]any{"denyOut": []string{"198.51.100.0/24"}}})
	if got, ok := pod.Annotations[podcontract.AnnotationEgress]; ok || pod.Annotations[podcontract.AnnotationEgressDeny] != "198.51.100.0/24" {
		t.Fatalf("egress %q (%v), deny %q", got, ok, pod.Annotations[podcontract.AnnotationEgressDeny])
	}
	_, pod = e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base", "network": map[string]any{"allowOut": []string{"api.example.com"}, "denyOut": []string{"0.0.0.0/0"}}})
	if got, ok := pod.Annotations[podcontract.AnnotationEgress]; ok || pod.Annotations[podcontract.AnnotationEgressDomains] != "api.example.com" {
		t.Fatalf("egress %q (%v), domains %q", got, ok, pod.Annotations[podcontract.AnnotationEgressDomains])
	}
	before := len(e.sandboxPods(nsA))
	r := e.call(http.MethodPost, "/v2/sandboxes", rawKeyA, map[string]any{"templateID": "base",
		"network": map[string]any{"allowOut": []string{"api.example.com"}}})
	if r.status != http.StatusBadRequest || !strings.Contains(r.apiError(t).Message, "narrows egress only when everything else is denied") {
		t.Fatalf("a domain rule: %d %s", r.status, r.body)
	}
	if n := len(e.sandboxPods(nsA)); n != before {
		t.Fatalf("a refused create made a pod: %d, had %d", n, before)
	}
}

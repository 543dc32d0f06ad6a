package gateway

import (
	"net/http"
	"reflect"
	"strings"
	"testing"
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
		{name: "internet off", internet: &off, want: map[string]string{AnnotationEgress: "none"}},
		{name: "deny all", deny: []string{"0.0.0.0/0"}, want: map[string]string{AnnotationEgress: "none"}},
		{name: "internet on but deny all", internet: &on, deny: []string{"0.0.0.0/0"}, want: map[string]string{AnnotationEgress: "none"}},
		{name: "deny all, allow some", deny: []string{"0.0.0.0/0", "8.8.8.0/24"}, allow: []string{"8.8.8.8", "1.1.1.0/24", "1.1.1.1/24"},
			want: map[string]string{AnnotationEgress: "1.1.1.0/24,8.8.8.8/32"}},
		{name: "internet off, allow some", internet: &off, allow: []string{" 203.0.113.7 "}, want: map[string]string{AnnotationEgress: "203.0.113.7/32"}},
		{name: "internet off, allow all", internet: &off, allow: []string{"0.0.0.0/0"}, want: map[string]string{AnnotationEgress: "0.0.0.0/0"}},
		{name: "deny some", deny: []string{"9.9.9.9", "198.51.100.0/24", "9.9.9.9/32"}, want: map[string]string{AnnotationEgressDeny: "9.9.9.9/32,198.51.100.0/24"}},
		{name: "deny some, allow others", deny: []string{"198.51.100.0/24"}, allow: []string{"203.0.113.0/24"}, want: map[string]string{AnnotationEgressDeny: "198.51.100.0/24"}},
		{name: "an allow covering a deny wins", deny: []string{"198.51.100.0/25", "9.9.9.9"}, allow: []string{"198.51.100.0/24"}, want: map[string]string{AnnotationEgressDeny: "9.9.9.9/32"}},
		{name: "an allow equal to the deny wins", deny: []string{"198.51.100.0/24"}, allow: []string{"198.51.100.0/24"}},
		{name: "an allow inside a deny", deny: []string{"198.51.100.0/24"}, allow: []string{"198.51.100.7"}, err: "lies inside denyOut 198.51.100.0/24"},
		{name: "an IPv6 deny is already so", deny: []string{"2001:db8::/32"}},
		{name: "an IPv4-mapped address", deny: []string{"::ffff:9.9.9.9"}, want: map[string]string{AnnotationEgressDeny: "9.9.9.9/32"}},
		{name: "an IPv6 allow", internet: &off, allow: []string{"2001:db8::1"}, err: "sandboxes have no IPv6"},
		{name: "a domain to allow", deny: []string{"0.0.0.0/0"}, allow: []string{"api.example.com"}, err: `"api.example.com" is a domain name: egress rules by domain are not supported`},
		{name: "a wildcard domain", allow: []string{"*.example.com"}, err: "domain name"},
		{name: "a domain to deny", deny: []string{"example.com"}, err: "network.denyOut"},
		{name: "not an address", allow: []string{"10.0.0.0/33"}, err: "not an IP address or CIDR"},
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
// annotations; a domain rule is refused before any pod is made.
func TestCreateEgress(t *testing.T) {
	e := newEnv(t)
	_, pod := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base", "allow_internet_access": false,
		"network": map[string]any{"allowOut": []string{"203.0.113.7"}}})
	if got := pod.Annotations[AnnotationEgress]; got != "203.0.113.7/32" {
		t.Fatalf("%s = %q", AnnotationEgress, got)
	}
	if got := pod.Annotations[AnnotationInternet]; got != "false" {
		t.Fatalf("%s = %q", AnnotationInternet, got)
	}
	_, pod = e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base", "network": map[string]any{"denyOut": []string{"198.51.100.0/24"}}})
	if got, ok := pod.Annotations[AnnotationEgress]; ok || pod.Annotations[AnnotationEgressDeny] != "198.51.100.0/24" {
		t.Fatalf("egress %q (%v), deny %q", got, ok, pod.Annotations[AnnotationEgressDeny])
	}
	before := len(e.sandboxPods(nsA))
	r := e.call(http.MethodPost, "/v2/sandboxes", rawKeyA, map[string]any{"templateID": "base",
		"network": map[string]any{"allowOut": []string{"api.example.com"}, "denyOut": []string{"0.0.0.0/0"}}})
	if r.status != http.StatusBadRequest || !strings.Contains(r.apiError(t).Message, "not supported by sandman's gateway yet") {
		t.Fatalf("a domain rule: %d %s", r.status, r.body)
	}
	if n := len(e.sandboxPods(nsA)); n != before {
		t.Fatalf("a refused create made a pod: %d, had %d", n, before)
	}
}

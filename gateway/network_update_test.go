package gateway

import (
	"context"
	"net/http"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandman-dev/sandman/podcontract"
)

// TestNetworkUpdate: PUT /sandboxes/{id}/network replaces the pod's egress
// annotations (what it omits is cleared) and answers 204 once the virtual
// node records them applied (simulated); getInfo reads them back; an
// update to what the sandbox has answers at once. rules and egressProxy
// are 501, a bad entry 400, another team's sandbox 404, and none of those
// changes the pod.
func TestNetworkUpdate(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	pods := e.client.CoreV1().Pods(nsA)
	sb, _ := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base", "network": map[string]any{"denyOut": []string{"198.51.100.0/24"}}})
	path := "/sandboxes/" + sb.SandboxID + "/network"

	done := make(chan response, 1)
	go func() {
		done <- e.call(http.MethodPut, path, rawKeyA, map[string]any{"denyOut": []string{"0.0.0.0/0"}, "allowOut": []string{"203.0.113.7", "api.example.com"}})
	}()
	var want string
	poll(t, "the new annotations", func() bool {
		p, err := pods.Get(ctx, sb.SandboxID, metav1.GetOptions{})
		if err != nil {
			return false
		}
		a := p.Annotations
		want = podcontract.EgressDigest(a)
		return a[podcontract.AnnotationEgress] == "203.0.113.7/32" && a[podcontract.AnnotationEgressDomains] == "api.example.com" && a[podcontract.AnnotationEgressDeny] == ""
	})
	select {
	case r := <-done:
		t.Fatalf("the update answered %d %s before the virtual node applied it", r.status, r.body)
	default:
	}
	// The virtual node applies it (simulated).
	p, _ := pods.Get(ctx, sb.SandboxID, metav1.GetOptions{})
	p.Annotations[podcontract.AnnotationEgressApplied] = want
	if _, err := pods.Update(ctx, p, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := <-done; r.status != http.StatusNoContent {
		t.Fatalf("update: %d %s", r.status, r.body)
	}
	var info sandboxDetail
	e.call(http.MethodGet, "/sandboxes/"+sb.SandboxID, rawKeyA, nil).decode(t, &info)
	if info.Network == nil || strings.Join(info.Network.AllowOut, ",") != "203.0.113.7/32,api.example.com" || strings.Join(info.Network.DenyOut, ",") != "0.0.0.0/0" {
		t.Errorf("getInfo's network after the update: %+v", info.Network)
	}
	// The same again: nothing to apply.
	if r := e.call(http.MethodPut, path, rawKeyA, map[string]any{"denyOut": []string{"0.0.0.0/0"}, "allowOut": []string{"203.0.113.7", "api.example.com"}}); r.status != http.StatusNoContent {
		t.Errorf("an update to what the sandbox has: %d %s", r.status, r.body)
	}

	before, _ := pods.Get(ctx, sb.SandboxID, metav1.GetOptions{})
	for _, tc := range []struct {
		key    string
		body   map[string]any
		status int
		says   string
	}{
		{rawKeyA, map[string]any{"rules": map[string]any{"api.example.com": []any{map[string]any{}}}}, http.StatusNotImplemented, "not supported"},
		{rawKeyA, map[string]any{"egressProxy": map[string]any{"address": "p:1080"}}, http.StatusNotImplemented, "not supported"},
		{rawKeyA, map[string]any{"allowOut": []string{"not an address"}}, http.StatusBadRequest, "allowOut"},
		{rawKeyB, map[string]any{}, http.StatusNotFound, "not found"},
	} {
		if r := e.call(http.MethodPut, path, tc.key, tc.body); r.status != tc.status || !strings.Contains(r.apiError(t).Message, tc.says) {
			t.Errorf("update %v: %d %s, want %d saying %q", tc.body, r.status, r.body, tc.status, tc.says)
		}
	}
	if after, _ := pods.Get(ctx, sb.SandboxID, metav1.GetOptions{}); podcontract.EgressDigest(after.Annotations) != podcontract.EgressDigest(before.Annotations) {
		t.Errorf("a refused update changed the pod: %v", after.Annotations)
	}
}

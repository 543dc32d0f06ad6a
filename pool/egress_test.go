package pool

import (
	"slices"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/fake"
)

// TestSetEgress: a bound pod's new egress goes to its node agent; a queued
// one's binds with it; a pod the pool does not hold is not found, bad
// egress is refused before any agent is asked, and a node agent that
// cannot change egress says so.
func TestSetEgress(t *testing.T) {
	var f *fake.Runtime
	p, rec := newSnapPool(t, Config{Name: "t"}, "w1", func(fr *fake.Runtime) runtime.Runtime { f = fr; return fr }, 1)
	bindAndWait(t, p, rec, "a")
	want := runtime.Egress{Egress: []string{"203.0.113.0/24"}, EgressDomains: []string{"api.example.com"}}
	if err := p.SetEgress(t.Context(), "a", want); err != nil {
		t.Fatal(err)
	}
	if got, ok := f.Egress("a"); !ok || !slices.Equal(got.Egress, want.Egress) || !slices.Equal(got.EgressDomains, want.EgressDomains) {
		t.Fatalf("the node has %+v (%v), want %+v", got, ok, want)
	}

	// b waits for a's slot; its egress changes while it waits.
	if err := p.Submit(request("b", "j", "img", 0)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b queued", func() bool { _, ok := p.queue.get("b"); return ok })
	if err := p.SetEgress(t.Context(), "b", runtime.Egress{EgressDeny: []string{"198.51.100.0/24"}}); err != nil {
		t.Fatal(err)
	}
	if req, _ := p.queue.get("b"); !slices.Equal(req.Bind.EgressDeny, []string{"198.51.100.0/24"}) {
		t.Fatalf("b's queued request: %+v", req.Bind)
	}

	if err := p.SetEgress(t.Context(), "nobody", want); !errdefs.IsNotFound(err) {
		t.Errorf("a pod the pool does not hold: %v", err)
	}
	if err := p.SetEgress(t.Context(), "a", runtime.Egress{Egress: []string{"not a cidr"}}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("bad egress: %v", err)
	}
	if got, _ := f.Egress("a"); !slices.Equal(got.Egress, want.Egress) {
		t.Errorf("a refused change reached the node: %+v", got)
	}

	old, orec := newSnapPool(t, Config{Name: "t2"}, "w2", func(fr *fake.Runtime) runtime.Runtime { return plainNode{fr} }, 1)
	bindAndWait(t, old, orec, "c")
	if err := old.SetEgress(t.Context(), "c", want); !errdefs.IsNotImplemented(err) {
		t.Errorf("a node agent that cannot: %v", err)
	}
}

package pool

import (
	"testing"

	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/fake"
)

// TestPausedLeavesTheFairShare: a paused pod does not count in its job's
// share, so when a slot frees, its job's queued pod goes before another
// job's that asked first; resumed, it counts again.
func TestPausedLeavesTheFairShare(t *testing.T) {
	p, rec := newSnapPool(t, Config{Name: "t"}, "w", func(fr *fake.Runtime) runtime.Runtime { return fr }, 3)
	gv := func(uid, job string) Request {
		r := request(uid, job, "img", 0)
		r.Bind.RuntimeHandler = runtime.RuntimeHandlerRunsc
		return r
	}
	for _, r := range []Request{gv("a1", "A"), request("b1", "B", "img", 0), request("b3", "B", "img", 0)} {
		if err := p.Submit(r); err != nil {
			t.Fatal(err)
		}
		eventually(t, r.Bind.Pod.UID+" bound", func() bool { _, ok := rec.last(r.Bind.Pod.UID, Bound); return ok })
	}
	held := func(job string) int {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.held[keyOf(request("x", job, "img", 0))]
	}
	if _, err := p.Pause(t.Context(), "a1"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a1's pause out of A's share", func() bool { return held("A") == 0 })

	// The node is full (the paused sandbox keeps its slot): b2, then a2,
	// wait; b3's slot goes to a2, whose job holds less.
	for _, r := range []Request{request("b2", "B", "img", 0), request("a2", "A", "img", 0)} {
		if err := p.Submit(r); err != nil {
			t.Fatal(err)
		}
		eventually(t, r.Bind.Pod.UID+" queued", func() bool { _, ok := p.Queued(r.Bind.Pod.UID); return ok })
	}
	if err := p.Release(t.Context(), "b3", 0); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a2 bound", func() bool { _, ok := rec.last("a2", Bound); return ok })
	if _, ok := rec.last("b2", Bound); ok {
		t.Fatal("b2 took the slot though its job held more than a2's")
	}
	if err := p.Resume(t.Context(), "a1"); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a1 back in A's share", func() bool { return held("A") == 2 })
}

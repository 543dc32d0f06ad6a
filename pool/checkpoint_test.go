package pool

import (
	"slices"
	"testing"
	"time"

	"github.com/containerd/errdefs"

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

// TestMovedIsUnplaced: a node's Moved exit is a Moved update with the
// checkpoint, not an exit; the pod is placed nowhere and out of its job's
// share, and submitted again with Bind.Restore it is placed on a node that
// has room. DeleteCheckpoint goes to the first node agent that stores
// checkpoints, and is unavailable when none does; it refuses to delete a
// checkpoint for a pod it is not of.
func TestMovedIsUnplaced(t *testing.T) {
	// Released slots stay releasing: the moved pod's cannot take it back.
	slow := func(c *fake.Config) { c.RecycleLatency = time.Hour }
	nodes := map[string]*fake.Runtime{"a": fakeNode(t, "a", 1, slow), "b": fakeNode(t, "b", 1, slow)}
	p, rec := newPool(t, Config{Name: "t"}, nodes["a"], nodes["b"])
	req := request("m", "j", "img", 0)
	req.Bind.RuntimeHandler = runtime.RuntimeHandlerRunsc
	if err := p.Submit(req); err != nil {
		t.Fatal(err)
	}
	eventually(t, "m bound", func() bool { _, ok := rec.last("m", Bound); return ok })
	bound, _ := rec.last("m", Bound)
	from, to := bound.Node, map[string]string{"a": "b", "b": "a"}[bound.Node]
	held := func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.held[keyOf(req)]
	}
	if held() != 1 {
		t.Fatalf("m holds %d of its job's share, want 1", held())
	}

	const ref = "reg.example/ckpt/ns/m@sha256:0123"
	moved, err := nodes[from].MoveOut("m", ref)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, "m moved", func() bool { _, ok := rec.last("m", Moved); return ok })
	u, _ := rec.last("m", Moved)
	if u.Node != from || u.Moved == nil || *u.Moved != moved || u.Reason != runtime.ReasonMoved {
		t.Errorf("moved update %+v (checkpoint %+v), want node %s, checkpoint %+v", u, u.Moved, from, moved)
	}
	if _, ok := rec.last("m", Exited); ok {
		t.Error("the move was reported as an exit too")
	}
	if node, ok := p.Placement("m"); ok {
		t.Errorf("m still placed on %s", node)
	}
	if held() != 0 {
		t.Errorf("m, moved, holds %d of its job's share", held())
	}

	req.Bind.Restore = u.Moved
	if err := p.Submit(req); err != nil {
		t.Fatalf("submit of the moved pod: %v", err)
	}
	eventually(t, "m bound again", func() bool { return len(rec.order(Bound)) == 2 })
	if u, _ := rec.last("m", Bound); u.Node != to {
		t.Errorf("m restored on %s, want %s (%s's slot is still releasing)", u.Node, to, from)
	}
	if got := nodes[to].Restores(); len(got) != 1 || got[0] != moved {
		t.Errorf("node %s restored %+v, want %+v", to, got, moved)
	}

	for _, other := range []runtime.PodRef{
		{UID: "x", Namespace: "other", Name: "m"}, // another namespace's pod of the same name
		{UID: "x", Namespace: "ns", Name: "n"},    // another pod of the namespace
	} {
		if err := p.DeleteCheckpoint(t.Context(), other, ref); !errdefs.IsInvalidArgument(err) {
			t.Errorf("m's checkpoint deleted for %+v: %v, want InvalidArgument", other, err)
		}
	}
	if err := p.DeleteCheckpoint(t.Context(), req.Bind.Pod, ref); err != nil {
		t.Fatal(err)
	}
	if a, b := nodes["a"].DeletedCheckpoints(), nodes["b"].DeletedCheckpoints(); !slices.Equal(a, []string{ref}) || len(b) != 0 {
		t.Errorf("deleted on a %v, on b %v: want %s on a only", a, b, ref)
	}
	plain, _ := newSnapPool(t, Config{Name: "plain"}, "w", func(fr *fake.Runtime) runtime.Runtime { return plainNode{fr} }, 1)
	if err := plain.DeleteCheckpoint(t.Context(), req.Bind.Pod, ref); !errdefs.IsUnavailable(err) {
		t.Errorf("delete through node agents that store no checkpoints: %v, want unavailable", err)
	}
}

// TestRestoreOnlyItsOwnCheckpoint: a bind that names another pod's
// checkpoint (another namespace's, or another pod's of its namespace)
// fails for good, as an invalid spec, and restores nothing; its own
// restores.
func TestRestoreOnlyItsOwnCheckpoint(t *testing.T) {
	node := fakeNode(t, "a", 3)
	p, rec := newPool(t, Config{Name: "t"}, node)
	for uid, ref := range map[string]string{
		"thief":    "reg.example/ckpt/victims/m@sha256:0123",
		"neighbor": "reg.example/ckpt/ns/m@sha256:0123",
	} {
		req := request(uid, "j", "img", 0)
		req.Bind.RuntimeHandler = runtime.RuntimeHandlerRunsc
		req.Bind.Restore = &runtime.MovedCheckpoint{Ref: ref, From: "b"}
		if err := p.Submit(req); err != nil {
			t.Fatal(err)
		}
		eventually(t, uid+" failed or bound", func() bool {
			_, failed := rec.last(uid, Failed)
			_, bound := rec.last(uid, Bound)
			return failed || bound
		})
		if u, ok := rec.last(uid, Failed); !ok || !u.Permanent || u.Reason != runtime.ReasonInvalidSpec {
			t.Errorf("%s restoring %s: %+v, want a permanent %s", uid, ref, u, runtime.ReasonInvalidSpec)
		}
	}
	own := request("m", "j", "img", 0)
	own.Bind.RuntimeHandler = runtime.RuntimeHandlerRunsc
	own.Bind.Restore = &runtime.MovedCheckpoint{Ref: "reg.example/ckpt/ns/m@sha256:0123", From: "b"}
	if err := p.Submit(own); err != nil {
		t.Fatal(err)
	}
	eventually(t, "m bound", func() bool { _, ok := rec.last("m", Bound); return ok })
	if got := node.Restores(); len(got) != 1 || got[0] != *own.Bind.Restore {
		t.Errorf("restores %+v, want m's own only", got)
	}
}

package pool

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/fake"
)

// snapNode is a fake node agent seen through the runtime.Runtime interface
// only (so whatever else the fake implements stays hidden), plus a
// Snapshot of the test's own.
type snapNode struct {
	runtime.Runtime
	snap func(context.Context, runtime.SnapshotRequest, func(runtime.SnapshotProgress)) (runtime.SnapshotResult, error)
}

func (s snapNode) Snapshot(ctx context.Context, req runtime.SnapshotRequest, progress func(runtime.SnapshotProgress)) (runtime.SnapshotResult, error) {
	return s.snap(ctx, req, progress)
}

// plainNode is a node agent that takes no snapshots.
type plainNode struct{ runtime.Runtime }

// newSnapPool is a pool over one node agent, node.
func newSnapPool(t *testing.T, cfg Config, name string, node func(*fake.Runtime) runtime.Runtime, slots int) (*Pool, *recorder) {
	t.Helper()
	f := fakeNode(t, name, slots)
	rec := &recorder{}
	cfg.OnUpdate = rec.add
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	p.AddNode(ctx, name, node(f))
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if err := p.WaitSynced(wctx); err != nil {
		t.Fatal(err)
	}
	return p, rec
}

func bindAndWait(t *testing.T, p *Pool, rec *recorder, uid string) {
	t.Helper()
	if err := p.Submit(request(uid, "j", "img", 0)); err != nil {
		t.Fatal(err)
	}
	eventually(t, uid+" bound", func() bool { _, ok := rec.last(uid, Bound); return ok })
}

func TestSnapshotFindsTheBoundPodsNode(t *testing.T) {
	var mu sync.Mutex
	var got []runtime.SnapshotRequest
	node := func(f *fake.Runtime) runtime.Runtime {
		return snapNode{Runtime: f, snap: func(ctx context.Context, req runtime.SnapshotRequest, progress func(runtime.SnapshotProgress)) (runtime.SnapshotResult, error) {
			mu.Lock()
			got = append(got, req)
			mu.Unlock()
			progress(runtime.SnapshotProgress{Phase: runtime.SnapshotFreeze})
			progress(runtime.SnapshotProgress{Phase: runtime.SnapshotPush, BytesDone: 5, BytesTotal: 10})
			progress(runtime.SnapshotProgress{Phase: runtime.SnapshotDone})
			return runtime.SnapshotResult{Image: "reg/snap:1", Digest: "sha256:abc", Frozen: time.Millisecond}, nil
		}}
	}
	p, rec := newSnapPool(t, Config{Name: "t"}, "w1", node, 2)
	bindAndWait(t, p, rec, "a")

	var phases []runtime.SnapshotPhase
	res, err := p.Snapshot(t.Context(), runtime.SnapshotRequest{PodUID: "a", Image: "snap:1"}, func(pr runtime.SnapshotProgress) {
		phases = append(phases, pr.Phase)
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Image != "reg/snap:1" || res.Digest != "sha256:abc" {
		t.Fatalf("result %+v", res)
	}
	if want := []runtime.SnapshotPhase{"freeze", "push", "done"}; fmt.Sprint(phases) != fmt.Sprint(want) {
		t.Fatalf("phases %v, want %v", phases, want)
	}
	if len(got) != 1 || got[0].PodUID != "a" || got[0].Image != "snap:1" {
		t.Fatalf("node asked %+v", got)
	}
}

func TestSnapshotRefusals(t *testing.T) {
	fails := func(f *fake.Runtime) runtime.Runtime {
		return snapNode{Runtime: f, snap: func(context.Context, runtime.SnapshotRequest, func(runtime.SnapshotProgress)) (runtime.SnapshotResult, error) {
			return runtime.SnapshotResult{}, fmt.Errorf("push to reg: denied: %w", errdefs.ErrPermissionDenied)
		}}
	}
	for _, tc := range []struct {
		name  string
		node  func(*fake.Runtime) runtime.Runtime
		setup func(t *testing.T, p *Pool, rec *recorder)
		uid   string
		class func(error) bool
		want  string
	}{
		{name: "unknown pod", node: fails, uid: "nobody", class: errdefs.IsNotFound,
			want: "pod nobody is neither queued nor placed in pool t"},
		{name: "waiting for a slot", node: fails, uid: "b", class: errdefs.IsFailedPrecondition,
			setup: func(t *testing.T, p *Pool, rec *recorder) {
				bindAndWait(t, p, rec, "a") // the only slot
				if err := p.Submit(request("b", "j", "img", 0)); err != nil {
					t.Fatal(err)
				}
			},
			want: "pod ns/b is not bound to a slot yet (WaitingForSlot)"},
		{name: "node takes no snapshots", node: func(f *fake.Runtime) runtime.Runtime { return plainNode{f} }, uid: "a",
			setup: func(t *testing.T, p *Pool, rec *recorder) { bindAndWait(t, p, rec, "a") },
			class: errdefs.IsNotImplemented, want: "node agent w1 takes no snapshots"},
		{name: "the node's error keeps its class", node: fails, uid: "a",
			setup: func(t *testing.T, p *Pool, rec *recorder) { bindAndWait(t, p, rec, "a") },
			class: errdefs.IsPermissionDenied, want: "snapshot of pod ns/a on node w1: push to reg: denied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, rec := newSnapPool(t, Config{Name: "t"}, "w1", tc.node, 1)
			if tc.setup != nil {
				tc.setup(t, p, rec)
			}
			_, err := p.Snapshot(t.Context(), runtime.SnapshotRequest{PodUID: tc.uid, Image: "snap:1"}, nil)
			if err == nil || !tc.class(err) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q of the right class", err, tc.want)
			}
		})
	}
}

func TestSnapshotBindingIsNotBound(t *testing.T) {
	release := make(chan struct{})
	node := func(f *fake.Runtime) runtime.Runtime { return slowBind{Runtime: f, release: release} }
	p, _ := newSnapPool(t, Config{Name: "t"}, "w1", node, 1)
	defer close(release)
	if err := p.Submit(request("a", "j", "img", 0)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "a placed", func() bool { _, ok := p.Placement("a"); return ok })
	_, err := p.Snapshot(t.Context(), runtime.SnapshotRequest{PodUID: "a", Image: "snap:1"}, nil)
	if !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "pod ns/a is not bound to a slot yet (binding on node w1)") {
		t.Fatalf("got %v", err)
	}
}

// slowBind holds every bind until release is closed.
type slowBind struct {
	runtime.Runtime
	release chan struct{}
}

func (s slowBind) Bind(ctx context.Context, req runtime.BindRequest) (runtime.Slot, error) {
	select {
	case <-s.release:
	case <-ctx.Done():
		return runtime.Slot{}, ctx.Err()
	}
	return s.Runtime.Bind(ctx, req)
}

// TestSnapshotsPerNodeWaitTheirTurn: beyond SnapshotsPerNode, a snapshot
// reports SnapshotQueued and waits until one ends, or until its context
// ends.
func TestSnapshotsPerNodeWaitTheirTurn(t *testing.T) {
	running := make(chan string, 3)
	finish := make(chan struct{})
	node := func(f *fake.Runtime) runtime.Runtime {
		return snapNode{Runtime: f, snap: func(ctx context.Context, req runtime.SnapshotRequest, _ func(runtime.SnapshotProgress)) (runtime.SnapshotResult, error) {
			running <- req.PodUID
			<-finish
			return runtime.SnapshotResult{Image: req.Image}, nil
		}}
	}
	p, rec := newSnapPool(t, Config{Name: "t", SnapshotsPerNode: 1}, "w1", node, 2)
	bindAndWait(t, p, rec, "a")
	bindAndWait(t, p, rec, "b")

	first := make(chan error, 1)
	go func() {
		_, err := p.Snapshot(context.Background(), runtime.SnapshotRequest{PodUID: "a", Image: "x"}, nil)
		first <- err
	}()
	if uid := <-running; uid != "a" {
		t.Fatalf("running %s", uid)
	}

	// The second one waits, says so, and gives up with its context.
	ctx, cancel := context.WithCancel(t.Context())
	queued := make(chan struct{})
	second := make(chan error, 1)
	go func() {
		_, err := p.Snapshot(ctx, runtime.SnapshotRequest{PodUID: "b", Image: "y"}, func(pr runtime.SnapshotProgress) {
			if pr.Phase == SnapshotQueued {
				close(queued)
			}
		})
		second <- err
	}()
	<-queued
	cancel()
	if err := <-second; !errdefs.IsCanceled(err) || !strings.Contains(err.Error(), "waiting for one of node w1's 1 snapshots to end") {
		t.Fatalf("cancelled while waiting: %v", err)
	}

	// A third one runs once the first ends.
	third := make(chan error, 1)
	go func() {
		_, err := p.Snapshot(context.Background(), runtime.SnapshotRequest{PodUID: "b", Image: "z"}, nil)
		third <- err
	}()
	finish <- struct{}{}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if uid := <-running; uid != "b" {
		t.Fatalf("running %s", uid)
	}
	finish <- struct{}{}
	if err := <-third; err != nil {
		t.Fatal(err)
	}
}

// TestForksPreferTheSnapshotsNode: a fork names its image by digest, which
// no agent's image list shows; the node the snapshot was taken on holds it
// and wins over an emptier one.
func TestForksPreferTheSnapshotsNode(t *testing.T) {
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	snap := func(f *fake.Runtime) runtime.Runtime {
		return snapNode{Runtime: f, snap: func(_ context.Context, req runtime.SnapshotRequest, _ func(runtime.SnapshotProgress)) (runtime.SnapshotResult, error) {
			return runtime.SnapshotResult{Image: "reg.local/envs/prepared:v1", Digest: digest}, nil
		}}
	}
	rec := &recorder{}
	p, err := New(Config{Name: "t", OnUpdate: rec.add})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	p.AddNode(ctx, "a", snap(fakeNode(t, "a", 4)))
	p.AddNode(ctx, "b", snap(fakeNode(t, "b", 4)))
	if err := p.WaitSynced(t.Context()); err != nil {
		t.Fatal(err)
	}
	bindAndWait(t, p, rec, "src")
	srcNode, _ := p.Placement("src")
	if _, err := p.Snapshot(t.Context(), runtime.SnapshotRequest{PodUID: "src", Image: "envs/prepared:v1"}, nil); err != nil {
		t.Fatal(err)
	}
	for _, uid := range []string{"fork-1", "fork-2"} {
		if err := p.Submit(request(uid, "j", "reg.local/envs/prepared:v1@"+digest, 0)); err != nil {
			t.Fatal(err)
		}
		eventually(t, uid+" bound", func() bool { _, ok := rec.last(uid, Bound); return ok })
		if node, _ := p.Placement(uid); node != srcNode {
			t.Fatalf("%s went to %s, not to %s where the snapshot is", uid, node, srcNode)
		}
	}
}

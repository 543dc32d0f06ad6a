package pool

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/fake"
)

// recorder keeps the pool's updates.
type recorder struct {
	mu      sync.Mutex
	updates []Update
}

func (r *recorder) add(u Update) {
	r.mu.Lock()
	r.updates = append(r.updates, u)
	r.mu.Unlock()
}

// last is the latest update of kind for uid, if any.
func (r *recorder) last(uid string, kind UpdateKind) (Update, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.updates) - 1; i >= 0; i-- {
		if u := r.updates[i]; u.UID == uid && u.Kind == kind {
			return u, true
		}
	}
	return Update{}, false
}

func (r *recorder) order(kind UpdateKind) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, u := range r.updates {
		if u.Kind == kind {
			out = append(out, u.UID)
		}
	}
	return out
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func newPool(t *testing.T, cfg Config, nodes ...*fake.Runtime) (*Pool, *recorder) {
	t.Helper()
	rec := &recorder{}
	if inner := cfg.OnUpdate; inner != nil {
		cfg.OnUpdate = func(u Update) { inner(u); rec.add(u) }
	} else {
		cfg.OnUpdate = rec.add
	}
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	for _, n := range nodes {
		inv, _ := n.Inventory(ctx)
		p.AddNode(ctx, inv.Node, n)
	}
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if err := p.WaitSynced(wctx); err != nil {
		t.Fatal(err)
	}
	return p, rec
}

func fakeNode(t *testing.T, name string, slots int, mutate ...func(*fake.Config)) *fake.Runtime {
	t.Helper()
	cfg := fake.Config{Node: name, Slots: slots}
	for _, m := range mutate {
		m(&cfg)
	}
	r, err := fake.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

func request(uid, job, image string, milliCPU int64) Request {
	return Request{Job: job, Bind: runtime.BindRequest{
		Pod:         runtime.PodRef{UID: uid, Namespace: "ns", Name: uid},
		TokenHashes: []string{"0000000000000000000000000000000000000000000000000000000000000000"},
		Containers: []runtime.ContainerSpec{{Name: "task", Image: image,
			Requests: runtime.Resources{MilliCPU: milliCPU}}},
	}}
}

func TestPlacementSpreadsAndPrefersTheImage(t *testing.T) {
	a := fakeNode(t, "a", 4, func(c *fake.Config) { c.Images = []string{"img:warm", "img:other"} })
	b := fakeNode(t, "b", 4, func(c *fake.Config) { c.Images = []string{"img:other"} })
	p, rec := newPool(t, Config{Name: "t"}, a, b)

	// Only a holds img:warm: both pods go there though b is as empty.
	for _, uid := range []string{"w1", "w2"} {
		if err := p.Submit(request(uid, "j", "img:warm", 0)); err != nil {
			t.Fatal(err)
		}
		eventually(t, uid+" bound", func() bool { _, ok := rec.last(uid, Bound); return ok })
		if u, _ := rec.last(uid, Bound); u.Node != "a" {
			t.Fatalf("%s placed on %s, want a (it holds the image)", uid, u.Node)
		}
	}
	// Both hold img:other: the emptier node (b) wins.
	if err := p.Submit(request("o1", "j", "img:other", 0)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "o1 bound", func() bool { _, ok := rec.last("o1", Bound); return ok })
	if u, _ := rec.last("o1", Bound); u.Node != "b" {
		t.Fatalf("o1 placed on %s, want b (less loaded)", u.Node)
	}
}

func TestNoCapacityWaitsThenBinds(t *testing.T) {
	a := fakeNode(t, "a", 2)
	p, rec := newPool(t, Config{Name: "t"}, a)
	for i := range 3 {
		if err := p.Submit(request(fmt.Sprint("p", i), "j", "img", 0)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "two bound, one queued", func() bool {
		_, q := rec.last("p2", Queued)
		return len(rec.order(Bound)) == 2 && q
	})
	u, _ := rec.last("p2", Queued)
	if u.Reason != "WaitingForSlot" || u.Message == "" {
		t.Fatalf("queued update %+v: want a reason and a message", u)
	}
	if pos, ok := p.Queued("p2"); !ok || pos != 0 {
		t.Fatalf("p2 queued=%v at %d", ok, pos)
	}
	if err := p.Release(t.Context(), "p0", 0); err != nil {
		t.Fatal(err)
	}
	eventually(t, "p2 bound after a release", func() bool { _, ok := rec.last("p2", Bound); return ok })
}

// TestUpdatesMayCallThePool: updates are told without the pool's lock, so
// their receiver may call the pool, as sandman-vk's provider does (its
// reconciler asks Unsynced under the lock its OnUpdate takes). dispatch
// told a pod it waits under the pool's lock: the provider and the pool
// deadlocked in an oversubscribed burst.
func TestUpdatesMayCallThePool(t *testing.T) {
	a := fakeNode(t, "a", 1)
	var p *Pool
	p, rec := newPool(t, Config{Name: "t", OnUpdate: func(u Update) {
		_ = p.Unsynced()
		_ = p.QueueLen()
		_, _ = p.Queued(u.UID)
	}}, a)
	for i := range 3 {
		if err := p.Submit(request(fmt.Sprint("p", i), "j", "img", 0)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "one bound, two told they wait", func() bool {
		_, q1 := rec.last("p1", Queued)
		_, q2 := rec.last("p2", Queued)
		return len(rec.order(Bound)) == 1 && q1 && q2
	})
	for i := range 2 {
		uid := rec.order(Bound)[i]
		if err := p.Release(t.Context(), uid, 0); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the next bound after a release", func() bool { return len(rec.order(Bound)) == i+2 })
	}
}

func TestResourcesMustFit(t *testing.T) {
	a := fakeNode(t, "a", 4, func(c *fake.Config) { c.Resources = runtime.Resources{MilliCPU: 1000, MemoryBytes: 1 << 30} })
	p, rec := newPool(t, Config{Name: "t"}, a)
	for _, uid := range []string{"big1", "big2"} {
		if err := p.Submit(request(uid, "j", "img", 600)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "one bound, one waiting", func() bool {
		_, q := rec.last("big2", Queued)
		return len(rec.order(Bound)) == 1 && q
	})
}

func TestAdmissionIsFairAcrossJobs(t *testing.T) {
	a := fakeNode(t, "a", 1)
	p, rec := newPool(t, Config{Name: "t"}, a)
	// Fill the only slot, then queue a burst of job A and one pod of job B.
	if err := p.Submit(request("first", "A", "img", 0)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "first bound", func() bool { _, ok := rec.last("first", Bound); return ok })
	for i := range 5 {
		if err := p.Submit(request(fmt.Sprint("a", i), "A", "img", 0)); err != nil {
			t.Fatal(err)
		}
	}
	if err := p.Submit(request("b0", "B", "img", 0)); err != nil {
		t.Fatal(err)
	}
	// Free the slot twice: a0 (head of A) then b0 (B's turn), not a1.
	for _, uid := range []string{"first", "a0"} {
		eventually(t, uid+" bound", func() bool { _, ok := rec.last(uid, Bound); return ok })
		if err := p.Release(t.Context(), uid, 0); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "b0 bound", func() bool { _, ok := rec.last("b0", Bound); return ok })
	if got := rec.order(Bound); fmt.Sprint(got) != "[first a0 b0]" {
		t.Fatalf("bind order %v, want [first a0 b0]", got)
	}
}

// TestAdmissionSharesSlotsMaxMin: a freed slot goes to the waiting job that
// holds the fewest, so a job arriving while another's burst holds the pool
// takes the slots that burst frees until it holds as many (round-robin would
// give it every other one).
func TestAdmissionSharesSlotsMaxMin(t *testing.T) {
	a := fakeNode(t, "a", 4)
	p, rec := newPool(t, Config{Name: "t"}, a)
	for i := range 4 {
		if err := p.Submit(request(fmt.Sprint("f", i), "A", "img", 0)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 4 {
		uid := fmt.Sprint("f", i)
		eventually(t, uid+" bound", func() bool { _, ok := rec.last(uid, Bound); return ok })
	}
	for _, r := range []Request{request("a0", "A", "img", 0), request("a1", "A", "img", 0),
		request("b0", "B", "img", 0), request("b1", "B", "img", 0)} {
		if err := p.Submit(r); err != nil {
			t.Fatal(err)
		}
	}
	// A holds 3 and B none: b0; A 2, B 1: b1; B has none waiting: a0.
	for i, next := range []string{"b0", "b1", "a0"} {
		if err := p.Release(t.Context(), fmt.Sprint("f", i), 0); err != nil {
			t.Fatal(err)
		}
		eventually(t, next+" bound", func() bool { _, ok := rec.last(next, Bound); return ok })
	}
	if got := rec.order(Bound); fmt.Sprint(got[4:]) != "[b0 b1 a0]" {
		t.Fatalf("bind order after the burst %v, want [b0 b1 a0]", got[4:])
	}
}

func TestQueueIsBounded(t *testing.T) {
	a := fakeNode(t, "a", 1)
	p, _ := newPool(t, Config{Name: "t", MaxQueued: 2}, a)
	var full error
	for i := range 5 {
		if err := p.Submit(request(fmt.Sprint("q", i), "j", "img", 0)); err != nil {
			full = err
		}
	}
	if full == nil {
		t.Fatal("a full queue accepted more pods")
	}
	if err := p.Submit(request("q0", "j", "img", 0)); err == nil {
		t.Fatal("a pod was submitted twice")
	}
}

func TestPermanentAndImageFailures(t *testing.T) {
	a := fakeNode(t, "a", 2, func(c *fake.Config) { c.Images = []string{"img"} })
	p, rec := newPool(t, Config{Name: "t"}, a)
	if err := p.Submit(request("missing", "j", "img:missing", 0)); err != nil {
		t.Fatal(err)
	}
	bad := request("bad", "j", "img", 0)
	bad.Bind.TokenHashes = nil // neither a token nor unauthenticated
	if err := p.Submit(bad); err != nil {
		t.Fatal(err)
	}
	eventually(t, "both failed", func() bool {
		_, m := rec.last("missing", Failed)
		_, b := rec.last("bad", Failed)
		return m && b
	})
	if u, _ := rec.last("missing", Failed); u.Permanent || u.Reason != runtime.ReasonErrImagePull {
		t.Fatalf("missing image: %+v", u)
	}
	if u, _ := rec.last("bad", Failed); !u.Permanent || u.Reason != runtime.ReasonInvalidSpec {
		t.Fatalf("invalid spec: %+v", u)
	}
	inv, _ := a.Inventory(t.Context())
	if inv.Count()[runtime.StateWarm] != 2 {
		t.Fatalf("slots after failed binds: %v", inv.Count())
	}
}

// TestLostNodeAgent moves the pool's clock past LostAfter instead of
// waiting for it.
func TestLostNodeAgent(t *testing.T) {
	a := fakeNode(t, "a", 2)
	b := fakeNode(t, "b", 2)
	clk := clocktesting.NewFakeClock(time.Now())
	p, rec := newPool(t, Config{Name: "t", LostAfter: time.Minute, Clock: clk}, a, b)
	if err := p.Submit(request("x", "j", "img", 0)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "x bound", func() bool { _, ok := rec.last("x", Bound); return ok })
	u, _ := rec.last("x", Bound)
	dead := map[string]*fake.Runtime{"a": a, "b": b}[u.Node]
	dead.Close()
	eventually(t, u.Node+" unhealthy", func() bool {
		for _, v := range p.Nodes() {
			if v.Name == u.Node {
				return !v.Healthy
			}
		}
		return false
	})
	// Each step ticks the pool's once-a-second check.
	eventually(t, "x lost", func() bool {
		clk.Step(time.Second)
		_, ok := rec.last("x", Lost)
		return ok
	})
	if l, _ := rec.last("x", Lost); l.Time.Sub(u.Time) < time.Minute {
		t.Fatalf("x reported lost %v after it was bound, before LostAfter (1m)", l.Time.Sub(u.Time))
	}
	if l, _ := rec.last("x", Lost); l.Reason != "NodeLost" || l.Node != u.Node {
		t.Fatalf("lost update %+v", l)
	}
	if c := p.Capacity(); c.Slots != 2 {
		t.Fatalf("capacity with one agent gone: %d slots, want 2", c.Slots)
	}
	// The sandbox may still run on the worker: the pool says so.
	for _, v := range p.Nodes() {
		if want := map[bool]int{true: 1, false: 0}[v.Name == u.Node]; v.Unseen != want {
			t.Errorf("node %s: %d unseen sandboxes, want %d", v.Name, v.Unseen, want)
		}
	}
	// New pods go to the agent that lives.
	if err := p.Submit(request("y", "j", "img", 0)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "y bound", func() bool { _, ok := rec.last("y", Bound); return ok })
	if y, _ := rec.last("y", Bound); y.Node == u.Node {
		t.Fatalf("y placed on the dead agent %s", y.Node)
	}
}

// TestPrePullReportsAndSteersPlacement: an image pre-pulled on one node
// reaches the pool as an images event, under its normalized name, and pods
// naming it the short way go to that node.
func TestPrePullReportsAndSteersPlacement(t *testing.T) {
	a := fakeNode(t, "a", 4)
	b := fakeNode(t, "b", 4, func(c *fake.Config) { c.PullLatency = 10 * time.Millisecond })
	p, rec := newPool(t, Config{Name: "t"}, a, b)

	if err := b.PrePull(t.Context(), []string{"docker.io/library/task:v1"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "b reports the image", func() bool {
		for _, v := range p.Nodes() {
			if v.Name == "b" && slices.Contains(v.Images, "docker.io/library/task:v1") {
				return true
			}
		}
		return false
	})
	// a is listed first and as empty: only the image sends the pod to b.
	if err := p.Submit(request("t1", "j", "task:v1", 0)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "t1 bound", func() bool { _, ok := rec.last("t1", Bound); return ok })
	if u, _ := rec.last("t1", Bound); u.Node != "b" {
		t.Fatalf("t1 placed on %s, want b (it pre-pulled the image)", u.Node)
	}

	got := p.ImageStatuses(t.Context())
	if len(got) != 2 || got[1].Node != "b" || len(got[1].Images) != 1 || got[1].Images[0].State != runtime.ImageReady || !got[1].Images[0].Pinned {
		t.Fatalf("image statuses %+v: want b holding the pinned image", got)
	}
	for _, n := range p.PrePull(t.Context(), []string{"x:1"}) {
		if n.Err != nil {
			t.Fatalf("pre-pull on %s: %v", n.Node, n.Err)
		}
	}
}

// TestReservationCountersBalance: the per-node counters placement reads
// (unseen reservations and their requests) return to zero once every pod
// is bound and seen, and once every pod is released, through binds that
// fail and are placed again too. The failures are Unavailable: the node is
// suspected, re-watched, and takes pods again (it used to stay unhealthy
// for as long as its watch stream stayed up).
func TestReservationCountersBalance(t *testing.T) {
	var flaky atomic.Int64
	a := fakeNode(t, "a", 8, func(c *fake.Config) {
		c.FailBind = func(req runtime.BindRequest) error {
			if flaky.Add(1)%3 == 0 {
				return fmt.Errorf("flaky: %w", errdefs.ErrUnavailable)
			}
			return nil
		}
	})
	b := fakeNode(t, "b", 8)
	p, rec := newPool(t, Config{Name: "t"}, a, b)
	balanced := func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, n := range p.nodes {
			if n.unseen != 0 || n.unseenRes != (runtime.Resources{}) {
				return false
			}
		}
		return true
	}
	for i := range 12 {
		if err := p.Submit(request(fmt.Sprintf("p%d", i), "j", "img", 100)); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "all bound", func() bool {
		for i := range 12 {
			if _, ok := rec.last(fmt.Sprintf("p%d", i), Bound); !ok {
				return false
			}
		}
		return true
	})
	eventually(t, "reservations all seen", balanced)
	for i := range 12 {
		if err := p.Release(t.Context(), fmt.Sprintf("p%d", i), 0); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "released and balanced", func() bool { return balanced() && len(p.Slots()) == 0 })
}

// TestWaitBindsSettled: a new leader waits for the binds its predecessor
// left running on an agent before it adopts what the agent holds.
func TestWaitBindsSettled(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	n := fakeNode(t, "n1", 2, func(c *fake.Config) { c.Clock, c.BindLatency = clk, time.Minute })
	p, _ := newPool(t, Config{}, n)
	// The old leader's bind, straight to the agent.
	bound := make(chan error, 1)
	go func() {
		_, err := n.Bind(context.Background(), request("old", "j", "busybox", 0).Bind)
		bound <- err
	}()
	eventually(t, "the pool to see the slot binding", func() bool { return p.bindingSlots() == 1 })
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Millisecond)
	err := p.WaitBindsSettled(ctx, time.Millisecond)
	cancel()
	if err == nil {
		t.Fatal("WaitBindsSettled returned while a slot was binding")
	}
	settled := make(chan error, 1)
	go func() { settled <- p.WaitBindsSettled(t.Context(), time.Millisecond) }()
	eventually(t, "the bind to wait on the clock", func() bool { return clk.HasWaiters() })
	clk.Step(time.Minute)
	if err := <-bound; err != nil {
		t.Fatalf("bind: %v", err)
	}
	if err := <-settled; err != nil {
		t.Fatalf("WaitBindsSettled: %v", err)
	}
	if slots := p.Slots(); len(slots) != 1 || slots[0].Slot.Pod.UID != "old" || slots[0].Slot.State != runtime.StateBound {
		t.Fatalf("slots after settling: %+v, want the old leader's pod bound", slots)
	}
}

// backoffClock is a fake clock that keeps the durations of the timers the
// pool asks for: only the reconnect back-off uses one.
type backoffClock struct {
	*clocktesting.FakeClock
	mu    sync.Mutex
	asked []time.Duration
}

func (c *backoffClock) NewTimer(d time.Duration) clock.Timer {
	c.mu.Lock()
	c.asked = append(c.asked, d)
	c.mu.Unlock()
	return c.FakeClock.NewTimer(d)
}

func (c *backoffClock) timers() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.asked)
}

// flakyAgent is a fake agent whose watch fails with err while err is set.
type flakyAgent struct {
	*fake.Runtime
	err atomic.Pointer[error]
}

func (a *flakyAgent) Watch(ctx context.Context) (runtime.Inventory, <-chan runtime.Event, error) {
	if err := a.err.Load(); err != nil {
		return runtime.Inventory{}, nil, *err
	}
	return a.Runtime.Watch(ctx)
}

// TestReconnectBackoff: the pool asks an agent that answers "not serving"
// (starting after a rolling update) again within a second however often
// it answered so, and watches it as soon as it serves; an agent it cannot
// reach is asked less and less often, up to every 10 s.
func TestReconnectBackoff(t *testing.T) {
	for _, tc := range []struct {
		name    string
		err     error
		longest time.Duration
	}{
		{"not serving", fmt.Errorf("node agent a not serving: starting: %w", runtime.ErrNotServing), time.Second},
		{"unreachable", fmt.Errorf("dial tcp: connection refused: %w", errdefs.ErrUnavailable), 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &backoffClock{FakeClock: clocktesting.NewFakeClock(time.Now())}
			p, _ := newPool(t, Config{Name: "t", Clock: clk})
			a := &flakyAgent{Runtime: fakeNode(t, "a", 2)}
			a.err.Store(&tc.err)
			p.AddNode(t.Context(), "a", a)
			// Each timer fires once the pool has asked for it: 12 failed
			// watches take a doubling back-off past 10 s.
			for i := 1; i <= 12; i++ {
				eventually(t, fmt.Sprintf("back-off timer %d", i), func() bool { return len(clk.timers()) >= i })
				if i < 12 {
					clk.Step(clk.timers()[i-1])
				}
			}
			asked := clk.timers()
			if got := slices.Max(asked); got != tc.longest {
				t.Errorf("longest back-off %v, want %v (timers %v)", got, tc.longest, asked)
			}
			a.err.Store(nil)
			clk.Step(asked[len(asked)-1])
			eventually(t, "agent a watched and healthy", func() bool {
				for _, n := range p.Nodes() {
					if n.Name == "a" {
						return n.Healthy
					}
				}
				return false
			})
		})
	}
}

// TestForkGoesToItsSourcesNode: a fork is placed on its source's node even
// where another has more room, waits in the queue while that node is full,
// and fails for good once its source is released.
func TestForkGoesToItsSourcesNode(t *testing.T) {
	a := fakeNode(t, "a", 2)
	b := fakeNode(t, "b", 4)
	p, rec := newPool(t, Config{Name: "t"}, a, b)
	gvisor := func(uid string) Request {
		r := request(uid, "j", "img", 0)
		r.Bind.RuntimeHandler = runtime.RuntimeHandlerRunsc
		return r
	}
	fork := func(uid, source string) Request {
		r := gvisor(uid)
		r.Bind.Fork = &runtime.ForkSource{PodUID: source, ID: "f1"}
		return r
	}
	// Forks fill the source's node, whichever it is, and then wait.
	if err := p.Submit(gvisor("src")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "src bound", func() bool { _, ok := rec.last("src", Bound); return ok })
	u, _ := rec.last("src", Bound)
	srcNode := u.Node
	for i := range 3 {
		if err := p.Submit(fork(fmt.Sprint("f", i), "src")); err != nil {
			t.Fatal(err)
		}
	}
	capacity := map[string]int{"a": 2, "b": 4}[srcNode] - 1
	eventually(t, "forks bound on the source's node, the rest queued", func() bool {
		n := 0
		for i := range 3 {
			if u, ok := rec.last(fmt.Sprint("f", i), Bound); ok {
				if u.Node != srcNode {
					t.Fatalf("fork f%d placed on %s, its source is on %s", i, u.Node, srcNode)
				}
				n++
			}
		}
		return n == min(3, capacity)
	})
	if capacity < 3 {
		eventually(t, "f2 queued while the source's node is full", func() bool { _, ok := rec.last("f2", Queued); return ok })
		if _, ok := rec.last("f2", Bound); ok {
			t.Fatalf("f2 bound on a full node")
		}
	}
	// A fork whose source is gone fails for good (in a job of its own:
	// a job's pods are admitted in order).
	orphan := fork("orphan", "nobody")
	orphan.Job = "other"
	if err := p.Submit(orphan); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the orphan fork failed", func() bool { _, ok := rec.last("orphan", Failed); return ok })
	if u, _ := rec.last("orphan", Failed); !u.Permanent || !strings.Contains(u.Message, "source pod nobody") {
		t.Fatalf("orphan fork: %+v, want a permanent failure naming its source", u)
	}
}

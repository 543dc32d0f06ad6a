package main

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sandman-dev/sandman/pool"
	"github.com/sandman-dev/sandman/runtime"
	rtfake "github.com/sandman-dev/sandman/runtime/fake"
)

const testLease = "sandman-vk-sandman-test"

func testElection(client *fake.Clientset, identity string) election {
	return election{Client: client, Namespace: "sandman-system", Name: testLease, Identity: identity,
		LeaseDuration: time.Second, RenewDeadline: 500 * time.Millisecond, RetryPeriod: 20 * time.Millisecond}
}

// heldLease is the Lease as another replica holds it, for seconds from
// when this replica first sees it (client-go times it from there).
func heldLease(holder string, seconds, transitions int32) *coordinationv1.Lease {
	renewed := time.Now()
	return &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Namespace: "sandman-system", Name: testLease},
		Spec: coordinationv1.LeaseSpec{HolderIdentity: &holder, LeaseDurationSeconds: &seconds,
			RenewTime: &metav1.MicroTime{Time: renewed}, AcquireTime: &metav1.MicroTime{Time: renewed}, LeaseTransitions: &transitions},
	}
}

// placingPool is a pool over one fake node agent with one pod queued: it
// binds the pod only while something runs it.
func placingPool(t *testing.T) (*pool.Pool, *rtfake.Runtime, *atomic.Int32) {
	t.Helper()
	rt, err := rtfake.New(rtfake.Config{Node: "w1", Slots: 4, Images: []string{"busybox"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	var bound atomic.Int32
	pl, err := pool.New(pool.Config{Name: "test", OnUpdate: func(u pool.Update) {
		if u.Kind == pool.Bound {
			bound.Add(1)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pl.AddNode(ctx, "w1", rt)
	if err := pl.WaitSynced(t.Context()); err != nil {
		t.Fatal(err)
	}
	submit(t, pl, "pod-1")
	return pl, rt, &bound
}

func submit(t *testing.T, pl *pool.Pool, uid string) {
	t.Helper()
	err := pl.Submit(pool.Request{Job: "j", Bind: runtime.BindRequest{
		Pod:         runtime.PodRef{UID: uid, Namespace: "ns", Name: uid},
		TokenHashes: []string{"0000000000000000000000000000000000000000000000000000000000000000"},
		Containers:  []runtime.ContainerSpec{{Name: "task", Image: "busybox"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
}

func boundSlots(t *testing.T, rt *rtfake.Runtime) int {
	t.Helper()
	inv, err := rt.Inventory(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, s := range inv.Slots {
		if s.Pod != nil {
			n++
		}
	}
	return n
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// leaseCalls counts the election's reads of the Lease.
func leaseCalls(client *fake.Clientset, verb string) *atomic.Int32 {
	var n atomic.Int32
	client.PrependReactor(verb, "leases", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
		n.Add(1)
		return false, nil, nil
	})
	return &n
}

// TestStandbyDoesNotPlace: while another replica holds the Lease, this one
// never leads: its pool follows the agent but binds nothing.
func TestStandbyDoesNotPlace(t *testing.T) {
	client := fake.NewClientset(heldLease("other", 3600, 0))
	gets := leaseCalls(client, "get")
	pl, rt, bound := placingPool(t)
	ctx, cancel := context.WithCancel(t.Context())
	var led atomic.Bool
	done := make(chan error, 1)
	go func() {
		done <- testElection(client, "me").run(ctx, func(ctx context.Context, epoch uint64) error {
			led.Store(true)
			return pl.Run(ctx)
		})
	}()
	// Many tries at the Lease, none taken.
	waitFor(t, "the standby to try the Lease 10 times", func() bool { return gets.Load() >= 10 })
	if led.Load() || bound.Load() != 0 || boundSlots(t, rt) != 0 {
		t.Fatalf("a standby led (%v) or bound (%d updates, %d slots)", led.Load(), bound.Load(), boundSlots(t, rt))
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run after a signal: %v, want nil", err)
	}
}

// TestLostLeaseStopsPlacing: a leader that cannot renew its Lease stops its
// placement (lead's context ends) within the renew deadline, before the
// Lease could be taken, and run says so with errLostLeadership.
func TestLostLeaseStopsPlacing(t *testing.T) {
	// Another replica holds the Lease for a second more and goes, after 4
	// changes of holder: this one's epoch is 6 (5 transitions, + 1).
	client := fake.NewClientset(heldLease("other", 1, 4))
	var partitioned atomic.Bool
	client.PrependReactor("*", "leases", func(k8stesting.Action) (bool, k8sruntime.Object, error) {
		if partitioned.Load() {
			return true, nil, errors.New("apiserver unreachable")
		}
		return false, nil, nil
	})
	pl, rt, bound := placingPool(t)
	var (
		mu        sync.Mutex
		epoch     uint64
		leadEnded time.Time
	)
	done := make(chan error, 1)
	go func() {
		done <- testElection(client, "me").run(t.Context(), func(ctx context.Context, e uint64) error {
			mu.Lock()
			epoch = e
			mu.Unlock()
			err := pl.Run(ctx)
			mu.Lock()
			leadEnded = time.Now()
			mu.Unlock()
			return err
		})
	}()
	waitFor(t, "the leader to bind the queued pod", func() bool { return bound.Load() == 1 })
	mu.Lock()
	if epoch != 6 {
		t.Errorf("epoch %d, want 6 (leaseTransitions 5 + 1)", epoch)
	}
	mu.Unlock()
	cut := time.Now()
	partitioned.Store(true)
	err := <-done
	if !errors.Is(err, errLostLeadership) {
		t.Fatalf("run: %v, want errLostLeadership", err)
	}
	mu.Lock()
	stoppedAfter := leadEnded.Sub(cut)
	mu.Unlock()
	// The last renewal was at most a retry period before the cut; the
	// Lease lasts a second past it.
	if leadEnded.IsZero() || stoppedAfter >= time.Second-20*time.Millisecond {
		t.Fatalf("placement stopped %v after the apiserver went away, want before the Lease expires (1s)", stoppedAfter)
	}
	// The pool no longer places: a new pod stays queued.
	submit(t, pl, "pod-2")
	if n, ok := pl.Queued("pod-2"); !ok || n != 0 || boundSlots(t, rt) != 1 {
		t.Fatalf("after losing the Lease: pod-2 queued %v, %d slots bound, want queued and 1", ok, boundSlots(t, rt))
	}
}

// TestSignalReleasesLease: a signal stops lead first, then releases the
// Lease at once (no holder), so a standby takes over without waiting for
// it to expire.
func TestSignalReleasesLease(t *testing.T) {
	client := fake.NewClientset()
	var leadDone atomic.Bool
	var releasedBeforeLeadDone atomic.Bool
	client.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, k8sruntime.Object, error) {
		l := a.(k8stesting.UpdateAction).GetObject().(*coordinationv1.Lease)
		if (l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "") && !leadDone.Load() {
			releasedBeforeLeadDone.Store(true)
		}
		return false, nil, nil
	})
	ctx, cancel := context.WithCancel(t.Context())
	leading := make(chan uint64, 1)
	done := make(chan error, 1)
	go func() {
		done <- testElection(client, "me").run(ctx, func(ctx context.Context, epoch uint64) error {
			leading <- epoch
			<-ctx.Done()
			time.Sleep(50 * time.Millisecond) // stopping takes a moment
			leadDone.Store(true)
			return nil
		})
	}()
	if e := <-leading; e != 1 {
		t.Errorf("epoch of the first leader of a new Lease: %d, want 1", e)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("run after a signal: %v, want nil", err)
	}
	l, err := client.CoordinationV1().Leases("sandman-system").Get(t.Context(), testLease, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if h := l.Spec.HolderIdentity; h != nil && *h != "" {
		t.Errorf("Lease still held by %q after the signal, want released", *h)
	}
	if releasedBeforeLeadDone.Load() {
		t.Error("the Lease was released before lead had stopped")
	}
}

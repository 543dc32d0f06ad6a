package pool

import (
	"fmt"
	"strings"
	"testing"

	"github.com/containerd/errdefs"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// requestIn is request for a pod of namespace ns.
func requestIn(ns, uid, job string) Request {
	r := request(uid, job, "img", 0)
	r.Bind.Pod.Namespace = ns
	return r
}

// TestAdmissionSharesSlotsAcrossNamespaces: the queue shares freed slots
// first between namespaces, by weight, then between the jobs inside each,
// so a namespace that gives every pod its own job label gets its
// namespace's share and no more (with a share per job it took every slot
// while its jobs held fewer than the other namespace's one).
func TestAdmissionSharesSlotsAcrossNamespaces(t *testing.T) {
	const slots = 12
	// burst is jobs × pods of namespace ns, queued while the pool is full.
	type burst struct {
		ns         string
		jobs, pods int
	}
	for _, tc := range []struct {
		name    string
		weights map[string]int
		bursts  []burst
		// want: of the slots freed one at a time, how many went to each
		// namespace ("a") and, where listed, to each job ("a/j0").
		want map[string]int
	}{
		{"a job label per pod buys no bigger share", nil,
			[]burst{{"a", 100, 1}, {"b", 1, 20}}, map[string]int{"a": 6, "b": 6}},
		{"weights 2:1 give 2:1", map[string]int{"a": 2},
			[]burst{{"a", 1, 20}, {"b", 1, 20}}, map[string]int{"a": 8, "b": 4}},
		{"weights 1:3 against a job per pod", map[string]int{"b": 3},
			[]burst{{"a", 50, 1}, {"b", 1, 20}}, map[string]int{"a": 3, "b": 9}},
		{"jobs inside a namespace share its part max-min", nil,
			[]burst{{"a", 2, 10}, {"b", 1, 20}}, map[string]int{"a": 6, "a/j0": 3, "a/j1": 3, "b": 6}},
		{"a namespace wanting less than its share leaves the rest", map[string]int{"a": 5},
			[]burst{{"a", 1, 2}, {"b", 1, 20}}, map[string]int{"a": 2, "b": 10}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, rec := newPool(t, Config{Name: "t", NamespaceWeights: tc.weights}, fakeNode(t, "n", slots))
			for i := range slots {
				if err := p.Submit(requestIn("fill", fmt.Sprint("fill", i), "fill")); err != nil {
					t.Fatal(err)
				}
			}
			eventually(t, "the pool full", func() bool { return len(rec.order(Bound)) == slots })
			jobOf := map[string]string{} // uid → namespace/job
			for _, b := range tc.bursts {
				for j := range b.jobs {
					for i := range b.pods {
						// Named as sandman-vk names jobs: namespace/label.
						uid, job := fmt.Sprintf("%s-j%d-%d", b.ns, j, i), fmt.Sprintf("%s/j%d", b.ns, j)
						if err := p.Submit(requestIn(b.ns, uid, job)); err != nil {
							t.Fatal(err)
						}
						jobOf[uid] = job
					}
				}
			}
			// Free the slots one at a time: each goes to the fairest.
			for i := range slots {
				if err := p.Release(t.Context(), fmt.Sprint("fill", i), 0); err != nil {
					t.Fatal(err)
				}
				eventually(t, fmt.Sprintf("freed slot %d taken", i), func() bool { return len(rec.order(Bound)) == slots+i+1 })
			}
			got := map[string]int{}
			for _, uid := range rec.order(Bound)[slots:] {
				nsJob := jobOf[uid]
				ns, _, _ := strings.Cut(nsJob, "/")
				got[ns]++
				got[nsJob]++
			}
			for k, n := range tc.want {
				if got[k] != n {
					t.Errorf("%s took %d of %d freed slots, want %d (all: %v)", k, got[k], slots, n, got)
				}
			}
			// The shares the pool reports agree: each namespace holds what
			// it took, and waits with the rest.
			var want []NamespaceShare
			for _, b := range tc.bursts {
				w := 1
				if v, ok := tc.weights[b.ns]; ok {
					w = v
				}
				want = append(want, NamespaceShare{Namespace: b.ns, Queued: b.jobs*b.pods - got[b.ns], Held: got[b.ns], Weight: w})
			}
			if got := p.Shares(); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("shares %+v, want %+v", got, want)
			}
			if n := testutil.CollectAndCount(p.Collector(), "sandman_pool_namespace_queue_depth"); n != len(tc.bursts) {
				t.Errorf("%d namespace queue depth series, want %d (one per namespace, none per job)", n, len(tc.bursts))
			}
			// Held counts return to nothing as every pod leaves.
			for uid := range jobOf {
				if err := p.Release(t.Context(), uid, 0); err != nil {
					t.Fatal(err)
				}
			}
			eventually(t, "no namespace queued or holding", func() bool { return len(p.Shares()) == 0 && p.QueueLen() == 0 })
			p.mu.Lock()
			defer p.mu.Unlock()
			if len(p.held) != 0 || len(p.heldNS) != 0 {
				t.Errorf("held counts left after every pod left: jobs %v, namespaces %v", p.held, p.heldNS)
			}
		})
	}
}

// TestQueueIsBoundedPerNamespace: one namespace cannot fill the admission
// queue; past its bound its pods are refused as a full queue refuses them,
// while another namespace still queues, up to the pool's bound.
func TestQueueIsBoundedPerNamespace(t *testing.T) {
	p, rec := newPool(t, Config{Name: "t", MaxQueued: 5, MaxQueuedPerNamespace: 3}, fakeNode(t, "n", 1))
	if err := p.Submit(requestIn("fill", "fill", "fill")); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the pool full", func() bool { _, ok := rec.last("fill", Bound); return ok })
	for _, step := range []struct {
		ns, uid string
		refused string // the error names this bound; "" for none
	}{
		{"a", "a0", ""},
		{"a", "a1", ""},
		{"a", "a2", ""},
		{"a", "a3", "namespace a has 3 pods in the admission queue of pool t, the most one namespace may queue (MaxQueuedPerNamespace 3)"},
		{"b", "b0", ""},
		{"b", "b1", ""},
		{"b", "b2", "the admission queue of pool t is full (5 pods)"},
	} {
		err := p.Submit(requestIn(step.ns, step.uid, "j"))
		switch {
		case step.refused == "" && err != nil:
			t.Fatalf("submit %s: %v", step.uid, err)
		case step.refused != "" && (!errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), step.refused)):
			t.Fatalf("submit %s: %v, want ResourceExhausted naming %q", step.uid, err, step.refused)
		}
	}
	// A pod of a that leaves the queue makes room for another of a.
	if err := p.Release(t.Context(), "a0", 0); err != nil {
		t.Fatal(err)
	}
	if err := p.Submit(requestIn("a", "a3", "j")); err != nil {
		t.Fatalf("a3 after a0 left the queue: %v", err)
	}
	if got := fmt.Sprint(p.Shares()); got != "[{a 3 0 1} {b 2 0 1} {fill 0 1 1}]" {
		t.Fatalf("shares %s", got)
	}
}

func TestNewChecksNamespaceBounds(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{}, true},
		{"per-namespace bound under the pool's", Config{MaxQueued: 10, MaxQueuedPerNamespace: 4}, true},
		{"per-namespace bound over the pool's", Config{MaxQueued: 10, MaxQueuedPerNamespace: 11}, false},
		{"weights", Config{NamespaceWeights: map[string]int{"a": 1, "b": maxWeight}}, true},
		{"weight 0", Config{NamespaceWeights: map[string]int{"a": 0}}, false},
		{"negative weight", Config{NamespaceWeights: map[string]int{"a": -2}}, false},
		{"weight over the bound", Config{NamespaceWeights: map[string]int{"a": maxWeight + 1}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.cfg.OnUpdate = func(Update) {}
			p, err := New(tc.cfg)
			if tc.ok != (err == nil) {
				t.Fatalf("New: %v, want ok=%v", err, tc.ok)
			}
			if err != nil && !errdefs.IsInvalidArgument(err) {
				t.Fatalf("New: %v, want InvalidArgument", err)
			}
			if p != nil && p.cfg.MaxQueuedPerNamespace > p.cfg.MaxQueued {
				t.Fatalf("MaxQueuedPerNamespace %d over MaxQueued %d", p.cfg.MaxQueuedPerNamespace, p.cfg.MaxQueued)
			}
		})
	}
}

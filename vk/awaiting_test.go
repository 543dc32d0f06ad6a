package vk

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/fake"
)

// gated is a node agent whose first inventory waits for open: slow, not
// dead.
type gated struct {
	*fake.Runtime
	open chan struct{}
}

func (g *gated) Watch(ctx context.Context) (runtime.Inventory, <-chan runtime.Event, error) {
	select {
	case <-g.open:
	case <-ctx.Done():
		return runtime.Inventory{}, nil, ctx.Err()
	}
	return g.Runtime.Watch(ctx)
}

// runReconciler runs the provider's reconciler until the test ends.
func (h *harness) runReconciler(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = h.p.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// ranBefore is a pod whose status an earlier provider wrote: it runs.
func ranBefore(name string) *corev1.Pod {
	pod := testPod(name, "img")
	pod.Status.Phase = corev1.PodRunning
	return pod
}

// A pod that ran before a restart, held by an agent that has not answered
// yet, is neither failed nor placed again; when that agent answers, it is
// adopted in its slot.
func TestAwaitsSlowAgent(t *testing.T) {
	h := newHarness(t, 2, func(c *Config) { c.ReconcileInterval = 10 * time.Millisecond })
	h.runReconciler(t)
	slow, err := fake.New(fake.Config{Node: "w2", Slots: 2, Images: []string{"img"}, IPBase: "10.9.1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(slow.Close)
	pod := ranBefore("held")
	req, err := h.p.bindRequest(pod)
	if err != nil {
		t.Fatal(err)
	}
	slot, err := slow.Bind(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	g := &gated{Runtime: slow, open: make(chan struct{})}
	h.pool.AddNode(t.Context(), "w2", g)

	if err := h.p.CreatePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	// Several reconciler rounds: nothing happens to it.
	deadline := time.Now().Add(200 * time.Millisecond)
	for time.Now().Before(deadline) {
		h.mu.Lock()
		st := h.statuses[pod.UID]
		h.mu.Unlock()
		if st != nil {
			t.Fatalf("a status was pushed while the pod's agent had not answered: %s %s %q", st.Status.Phase, st.Status.Reason, st.Status.Message)
		}
		if inv, _ := h.node.Inventory(t.Context()); inv.Count()[runtime.StateBound] != 0 {
			t.Fatal("the pod was placed again on the agent that answered")
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(g.open)
	got := h.wait(t, pod.UID, "adopted on w2", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodRunning })
	if got.Status.PodIP != slot.IP {
		t.Errorf("adopted with IP %q, the slot has %q", got.Status.PodIP, slot.IP)
	}
}

// Once every agent has answered without it, such a pod is lost.
func TestAwaitingPodLostWhenAllAnswered(t *testing.T) {
	h := newHarness(t, 2, func(c *Config) { c.ReconcileInterval = 10 * time.Millisecond })
	h.runReconciler(t)
	slow, err := fake.New(fake.Config{Node: "w2", Slots: 2, Images: []string{"img"}, IPBase: "10.9.1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(slow.Close)
	g := &gated{Runtime: slow, open: make(chan struct{})}
	h.pool.AddNode(t.Context(), "w2", g)
	pod := ranBefore("gone")
	if err := h.p.CreatePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	close(g.open)
	got := h.wait(t, pod.UID, "lost", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
	if got.Status.Reason != "SandboxLost" {
		t.Errorf("reason %q %q, want SandboxLost", got.Status.Reason, got.Status.Message)
	}
}

// statusWrites counts the pod status updates the provider wrote itself.
func (h *harness) statusWrites() int {
	n := 0
	for _, a := range h.client.Actions() {
		if a.GetVerb() == "update" && a.GetSubresource() == "status" {
			n++
		}
	}
	return n
}

// A Ready pod that someone else marks not ready (kube-controller-manager
// does, for every pod of a node it took for unreachable) is written Ready
// again by the reconciler; one whose status agrees is left alone.
func TestRestoresReadyAnotherWriterTookAway(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	h := newHarness(t, 1, func(c *Config) {
		c.Clock = clk
		c.Pods = corev1listers.NewPodLister(idx)
		c.ReconcileInterval = time.Second
	})
	h.runReconciler(t)
	pod := testPod("marked", "img")
	if _, err := h.client.CoreV1().Pods("ns").Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.p.CreatePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	ready := h.wait(t, pod.UID, "Ready", isReady)
	// The API agrees: rounds past the grace write nothing.
	inAPI, err := h.client.CoreV1().Pods("ns").UpdateStatus(t.Context(), ready, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := idx.Add(inAPI); err != nil {
		t.Fatal(err)
	}
	before := h.statusWrites()
	for range 10 {
		clk.Step(time.Second)
	}
	if err := wait.PollUntilContextTimeout(t.Context(), 20*time.Millisecond, 300*time.Millisecond, true, func(context.Context) (bool, error) {
		return h.statusWrites() != before, nil
	}); err == nil {
		t.Fatalf("a status that agrees was written again (%d writes, %d before)", h.statusWrites(), before)
	}

	// The node lifecycle controller's write.
	marked := inAPI.DeepCopy()
	for i, c := range marked.Status.Conditions {
		if c.Type == corev1.PodReady {
			marked.Status.Conditions[i].Status, marked.Status.Conditions[i].Reason = corev1.ConditionFalse, "NodeNotReady"
		}
	}
	marked, err = h.client.CoreV1().Pods("ns").UpdateStatus(t.Context(), marked, metav1.UpdateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := idx.Update(marked); err != nil {
		t.Fatal(err)
	}
	poll(t, "the pod written Ready again", func() bool {
		clk.Step(time.Second)
		got, err := h.client.CoreV1().Pods("ns").Get(t.Context(), "marked", metav1.GetOptions{})
		return err == nil && isReady(got)
	})
}

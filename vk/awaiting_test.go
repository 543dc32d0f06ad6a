package vk

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

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

//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
)

// TestVKDrainWhenCordoned: cordoning a worker drains its node agent: the
// pods there fail Evicted with a message naming the cordon, new pods go to
// the other worker, the drained agent holds no slot at all; uncordoned, it
// takes sandboxes again.
func TestVKDrainWhenCordoned(t *testing.T) {
	s := framework.Get(t)
	// 8 slots each: the other agent has room for a new pod whichever way
	// the first six were placed.
	p := startPool(t, s, 2, 8)
	ctx := t.Context()
	drained := p.agents[0]
	// The host-process agents are not kubelet nodes: give the agent a Node
	// object of its name to watch, as its worker's would be in a cluster.
	if _, err := s.Kube.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: drained.name,
		Labels: map[string]string{"sandman.io/e2e": "drain"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Kube.CoreV1().Nodes().Delete(context.Background(), drained.name, metav1.DeleteOptions{}) })
	drained.proc.stop(t)
	drained.args = append(drained.args, "--drain-when-cordoned", "--kubeconfig", s.Env["KUBECONFIG"])
	drained.restart(t)
	slotsOn := func(a *vagent) map[runtime.SlotState]int {
		inv, err := a.client.Inventory(ctx)
		if err != nil {
			return nil
		}
		return inv.Count()
	}
	framework.Eventually(t, time.Minute, "the restarted agent to have warm slots", func(context.Context) (bool, error) {
		return slotsOn(drained)[runtime.StateWarm] > 0, nil
	})

	var names []string
	for i := range 6 {
		names = append(names, fmt.Sprintf("before-%d", i))
		p.create(p.newPod(names[i], s.BusyboxImage))
	}
	for _, n := range names {
		p.waitPod(n, 2*time.Minute, "Ready", podReady)
	}
	bound, err := p.boundSlots(ctx)
	if err != nil {
		t.Fatal(err)
	}
	onDrained := map[string]bool{}
	for uid := range bound {
		if inv, _ := drained.client.Inventory(ctx); true {
			for _, sl := range inv.Slots {
				if sl.Pod != nil && sl.Pod.UID == uid {
					onDrained[sl.Pod.Name] = true
				}
			}
		}
	}
	if len(onDrained) == 0 {
		t.Fatal("no pod landed on the agent to drain")
	}

	cordon := func(on bool) {
		patch := fmt.Sprintf(`{"spec":{"unschedulable":%v}}`, on)
		if _, err := s.Kube.CoreV1().Nodes().Patch(ctx, drained.name, types.MergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	cordon(true)
	for _, n := range names {
		if !onDrained[n] {
			continue
		}
		pod := p.waitPod(n, time.Minute, "evicted by the drain", func(pod *corev1.Pod) bool { return pod.Status.Phase == corev1.PodFailed })
		if pod.Status.Reason != runtime.ReasonEvicted || !strings.Contains(pod.Status.Message, "cordoned") {
			t.Errorf("pod %s: %s %q, want Evicted naming the cordon", n, pod.Status.Reason, pod.Status.Message)
		}
	}
	for _, n := range names {
		if onDrained[n] {
			continue
		}
		if pod := p.waitPod(n, time.Second, "still Ready on the other agent", podReady); pod.Status.Phase != corev1.PodRunning {
			t.Errorf("pod %s on the other agent: %s", n, pod.Status.Phase)
		}
	}
	framework.Eventually(t, time.Minute, "the drained agent to hold no slot", func(context.Context) (bool, error) {
		c := slotsOn(drained)
		return c != nil && len(c) == 0, nil
	})
	// A new pod goes to the other agent.
	p.create(p.newPod("while-drained", s.BusyboxImage))
	p.waitPod("while-drained", time.Minute, "Ready", podReady)
	if c := slotsOn(drained); len(c) != 0 {
		t.Errorf("the drained agent took a slot: %v", c)
	}

	cordon(false)
	framework.Eventually(t, time.Minute, "the agent to take sandboxes again (warm slots back)", func(context.Context) (bool, error) {
		return slotsOn(drained)[runtime.StateWarm] > 0, nil
	})
}

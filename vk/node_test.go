package vk

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
)

// TestQueueRoom: with queue room the node advertises slots + room pods and
// CPU and memory scaled alike, and says so; without, exactly its slots.
func TestQueueRoom(t *testing.T) {
	capa := runtime.Capacity{Slots: 1000, Resources: runtime.Resources{MilliCPU: 250_000, MemoryBytes: 1 << 40}}
	cfg := nodeConfig{Name: "vn", PoolName: "p"}

	n := nodeSpec(cfg, capa, 10)
	if got := n.Status.Capacity.Pods().Value(); got != 1000 {
		t.Errorf("truthful: pods %d, want 1000", got)
	}
	if _, ok := n.Annotations[podcontract.AnnotationQueueRoom]; ok {
		t.Error("truthful: a queue-room annotation")
	}
	for _, c := range n.Status.Conditions {
		if c.Type == podcontract.ConditionQueueRoom {
			t.Error("truthful: a queue-room condition")
		}
	}

	cfg.QueueRoom = 4000
	n = nodeSpec(cfg, capa, 10)
	st := n.Status
	if got := st.Capacity.Pods().Value(); got != 5000 {
		t.Errorf("pods %d, want 5000 (1000 slots + 4000 room)", got)
	}
	if got := st.Allocatable.Cpu().MilliValue(); got != 1_250_000 {
		t.Errorf("cpu %dm, want 1250000m (×5)", got)
	}
	if got := st.Allocatable.Memory().Value(); got != 5<<40 {
		t.Errorf("memory %d, want 5Ti", got)
	}
	if n.Annotations[podcontract.AnnotationQueueRoom] != "4000" || !strings.HasPrefix(n.Annotations[podcontract.AnnotationSlots], "1000 slots, 250 CPU, 1Ti memory") {
		t.Errorf("annotations %v", n.Annotations)
	}
	var cond *corev1.NodeCondition
	for i, c := range st.Conditions {
		if c.Type == podcontract.ConditionQueueRoom {
			cond = &st.Conditions[i]
		}
	}
	if cond == nil || cond.Status != corev1.ConditionTrue || !strings.Contains(cond.Message, "4000 queued pods beyond the pool's 1000 slots") {
		t.Errorf("condition %+v", cond)
	}

	// No slots: nothing is advertised, room or not.
	if pods, cpu, mem := Advertised(runtime.Capacity{}, 4000); pods != 0 || cpu != 0 || mem != 0 {
		t.Errorf("no slots: %d pods, %dm, %d", pods, cpu, mem)
	}
	// An agent reporting an enormous memory figure with the default room:
	// saturated, never negative (the apiserver refuses a negative capacity).
	huge := runtime.Capacity{Slots: 8, Resources: runtime.Resources{MilliCPU: 2000, MemoryBytes: 1 << 60}}
	if pods, cpu, mem := Advertised(huge, 100_000); pods != 100_008 || cpu != 25_002_000 || mem != maxAdvertised {
		t.Errorf("huge memory: %d pods, %dm, %d", pods, cpu, mem)
	}
}

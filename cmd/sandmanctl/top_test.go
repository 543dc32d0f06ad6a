package main

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sandman-dev/sandman/runtime"
	vkapi "github.com/sandman-dev/sandman/vk/api"
)

func TestWriteTop(t *testing.T) {
	c := vkapi.Capacity{Time: time.Now(), Pool: "p", VirtualNode: "sandman-p", Queue: 7,
		Pods: map[string]int{string(corev1.PodRunning): 3, string(corev1.PodPending): 7},
		Nodes: []vkapi.NodeCapacity{
			{Name: "w1", Healthy: true, CapacitySlots: 8, Slots: map[runtime.SlotState]int{runtime.StateWarm: 5, runtime.StateBound: 3, runtime.StatePaused: 2},
				CPU: vkapi.Amount{Allocated: 1.5, Capacity: 4}, Memory: vkapi.Amount{Allocated: 1 << 30, Capacity: 8 << 30},
				Images: []string{"a", "b"}, Binds: 3, BindP50MS: 60, BindP99MS: 120},
			{Name: "w2", Healthy: false, Error: "connection refused", CapacitySlots: 8, Slots: map[runtime.SlotState]int{}},
		},
		Totals: vkapi.CapacityTotals{Nodes: 2, HealthyNodes: 1, CapacitySlots: 8,
			Slots: map[runtime.SlotState]int{runtime.StateWarm: 5, runtime.StateBound: 3}},
		CreateToReady: vkapi.ReadyHistogram{Window: "5m", Count: 3, P50MS: 70, P99MS: 140},
	}
	var b strings.Builder
	writeTop(&b, c)
	out := b.String()
	lines := strings.Split(out, "\n")
	w1 := strings.Fields(lines[1])
	if len(w1) < 15 || w1[0] != "w1" || w1[2] != "5" || w1[5] != "3" || w1[6] != "2" || w1[9] != "8" || w1[10] != "1.50/4.00" || w1[12] != "2" || w1[13] != "60.0ms" {
		t.Fatalf("w1 row %q", lines[1])
	}
	for _, want := range []string{"UNHEALTHY", "TOTAL", "1/2", "queue 7", "7 pending, 3 running", "p50 70ms p99 140ms over 3", "unhealthy: w2: connection refused"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

package vk

import (
	"testing"
	"time"
)

func TestPodTraceStages(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tests := []struct {
		name  string
		trace podTrace
		want  map[string]time.Duration
	}{
		{"every stage", podTrace{placed: at(2), bound: at(10), readyOnNode: at(13), readySeen: at(14)},
			map[string]time.Duration{"admit": 2 * time.Millisecond, "bind": 8 * time.Millisecond, "ready": 3 * time.Millisecond,
				"notify": time.Millisecond, "status": 6 * time.Millisecond}},
		// An adopted pod was never placed or bound by this provider.
		{"adopted", podTrace{readyOnNode: at(13), readySeen: at(14)},
			map[string]time.Duration{"notify": time.Millisecond, "status": 6 * time.Millisecond}},
		// The node's clock ahead of ours: no negative stage.
		{"skewed node clock", podTrace{placed: at(2), bound: at(10), readyOnNode: at(30), readySeen: at(14)},
			map[string]time.Duration{"admit": 2 * time.Millisecond, "bind": 8 * time.Millisecond, "ready": 20 * time.Millisecond,
				"notify": 0, "status": 6 * time.Millisecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := map[string]time.Duration{}
			for _, s := range tt.trace.stages(t0, at(20)) {
				got[s.name] = s.d
			}
			if len(got) != len(tt.want) {
				t.Fatalf("stages %v, want %v", got, tt.want)
			}
			for k, v := range tt.want {
				if got[k] != v {
					t.Errorf("stage %s = %v, want %v", k, got[k], v)
				}
			}
		})
	}
}

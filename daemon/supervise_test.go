package daemon

import (
	"testing"
	"time"
)

func TestRestartPolicy(t *testing.T) {
	for _, tc := range []struct {
		policy string
		code   int
		want   bool
	}{
		{"", 1, false}, {"Never", 1, false}, {"OnFailure", 0, false}, {"OnFailure", 2, true}, {"Always", 0, true}, {"Always", 137, true},
	} {
		if got := restartWanted(tc.policy, tc.code); got != tc.want {
			t.Errorf("restartWanted(%q, %d) = %v", tc.policy, tc.code, got)
		}
	}
	if err := checkRestartPolicy("Sometimes"); err == nil {
		t.Error("an unknown policy was accepted")
	}
	for _, tc := range []struct {
		restarts int
		ran      time.Duration
		want     time.Duration
	}{
		{1, 0, time.Second}, {2, 0, 2 * time.Second}, {4, time.Minute, 8 * time.Second}, {30, 0, 5 * time.Minute}, {30, 11 * time.Minute, time.Second},
	} {
		if got := restartDelay(tc.restarts, tc.ran); got != tc.want {
			t.Errorf("restartDelay(%d, %v) = %v, want %v", tc.restarts, tc.ran, got, tc.want)
		}
	}
}

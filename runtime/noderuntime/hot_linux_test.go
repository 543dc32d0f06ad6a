package noderuntime

import (
	"testing"
	"time"
)

// TestHotBackoff: a failing image's hot starts back off from 1 s, doubling,
// to at most 5 minutes.
func TestHotBackoff(t *testing.T) {
	var d time.Duration
	var got []time.Duration
	for range 11 {
		d = nextHotBackoff(d)
		got = append(got, d)
	}
	want := []time.Duration{1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300}
	for i := range want {
		if got[i] != want[i]*time.Second {
			t.Fatalf("back-offs %v, want %v seconds", got, want)
		}
	}
}

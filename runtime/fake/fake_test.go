package fake_test

import (
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/fake"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

func TestConformance(t *testing.T) {
	runtimetest.Suite(t, func(t *testing.T) runtimetest.Harness {
		rt, err := fake.New(fake.Config{
			Node: "fake-1", Slots: 4,
			Images:      []string{"busybox", "noshell"},
			BindLatency: time.Millisecond, ReadyLatency: time.Millisecond, RecycleLatency: time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rt.Close)
		return runtimetest.Harness{
			Runtime: rt, Slots: 4, WarmSlots: 4,
			Image: "busybox", NoShellImage: "noshell", MissingImage: "nope:latest",
		}
	})
}

// TestLatenciesRunOnTheClock: readiness and recycling wait on the node's
// clock, which the test moves; Close stops what still waits.
func TestLatenciesRunOnTheClock(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	rt, err := fake.New(fake.Config{Node: "n", Slots: 2, ReadyLatency: time.Minute, RecycleLatency: time.Minute, PullLatency: time.Hour, Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	_, events, err := rt.Watch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Bind(t.Context(), runtimetest.Request("a", "img")); err != nil {
		t.Fatal(err)
	}
	// The ready timer is armed by a goroutine: step until it fires.
	deadline := time.Now().Add(10 * time.Second)
	for ready := false; !ready; {
		clk.Step(time.Minute)
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("watch ended")
			}
			if ev.Type != runtime.EventReady {
				continue
			}
			if !ev.Time.After(time.Now().Add(30 * time.Second)) {
				t.Fatalf("ready at %v: not on the fake clock", ev.Time)
			}
			ready = true
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting for the slot to be ready")
		}
	}
	// A recycle and a pull still wait when the node closes: Close stops
	// them (TestMain's leak check fails otherwise).
	if err := rt.Release(t.Context(), "a", 0); err != nil {
		t.Fatal(err)
	}
	if err := rt.PrePull(t.Context(), []string{"img2"}); err != nil {
		t.Fatal(err)
	}
}

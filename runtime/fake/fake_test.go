package fake_test

import (
	"slices"
	"testing"
	"time"

	"github.com/containerd/errdefs"
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

// TestMoveOut: a running gVisor pod moved out publishes a Moved exit with
// its checkpoint, after its slot paused, and its slot is released; a
// paused one says it was paused; a runc one does not move. A bind restores
// a moved sandbox only under gVisor, and only its own, and is recorded;
// DeleteCheckpoint records what it deletes, and refuses another pod's.
func TestMoveOut(t *testing.T) {
	rt, err := fake.New(fake.Config{Node: "n", Slots: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer rt.Close()
	_, events, err := rt.Watch(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	gvisor := func(uid string) runtime.BindRequest {
		req := runtimetest.Request(uid, "img")
		req.RuntimeHandler = runtime.RuntimeHandlerRunsc
		return req
	}
	for _, req := range []runtime.BindRequest{gvisor("run"), gvisor("paused"), runtimetest.Request("runc", "img")} {
		if _, err := rt.Bind(t.Context(), req); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := rt.Pause(t.Context(), "paused"); err != nil {
		t.Fatal(err)
	}
	const ref = "reg.example/ckpt/suite/pod-run@sha256:0123"
	for _, tc := range []struct {
		uid    string
		paused bool
	}{{"run", false}, {"paused", true}} {
		moved, err := rt.MoveOut(tc.uid, ref)
		if err != nil {
			t.Fatal(err)
		}
		if want := (runtime.MovedCheckpoint{Ref: ref, Paused: tc.paused, From: "n"}); moved != want {
			t.Errorf("%s moved: %+v, want %+v", tc.uid, moved, want)
		}
		var sawPaused bool
		ev := runtimetest.WaitEvent(t, events, 5*time.Second, tc.uid+"'s exit", func(ev runtime.Event) bool {
			if ev.Slot.Pod != nil && ev.Slot.Pod.UID == tc.uid && ev.Type == runtime.EventSlot && ev.Slot.State == runtime.StatePaused {
				sawPaused = true
			}
			return ev.Type == runtime.EventExit && ev.Slot.Pod != nil && ev.Slot.Pod.UID == tc.uid
		})
		if ev.Reason != runtime.ReasonMoved || ev.Moved == nil || *ev.Moved != moved || ev.Container != "task" {
			t.Errorf("%s's exit: %+v, want reason Moved with %+v", tc.uid, ev, moved)
		}
		if !tc.paused && !sawPaused {
			t.Errorf("%s moved without its slot paused first", tc.uid)
		}
		runtimetest.WaitEvent(t, events, 5*time.Second, tc.uid+"'s slot warm again", func(ev runtime.Event) bool {
			return ev.Type == runtime.EventSlot && ev.Slot.State == runtime.StateWarm
		})
		if _, err := rt.MoveOut(tc.uid, ref); !errdefs.IsNotFound(err) {
			t.Errorf("%s moved twice: %v", tc.uid, err)
		}
	}
	if _, err := rt.MoveOut("runc", ref); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("a runc pod moved: %v", err)
	}

	// The pod that ran comes back (the same namespace, name and UID).
	restore := gvisor("run")
	restore.Restore = &runtime.MovedCheckpoint{Ref: ref, From: "n"}
	if _, err := rt.Bind(t.Context(), restore); err != nil {
		t.Fatal(err)
	}
	runc := runtimetest.Request("run", "img")
	runc.Pod.UID = "runc-back"
	runc.Restore = restore.Restore
	if _, err := rt.Bind(t.Context(), runc); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a runc pod restored: %v", err)
	}
	other := gvisor("other")
	other.Restore = restore.Restore
	if _, err := rt.Bind(t.Context(), other); !errdefs.IsInvalidArgument(err) {
		t.Errorf("another pod restored pod-run's checkpoint: %v", err)
	}
	if got := rt.Restores(); len(got) != 1 || got[0] != *restore.Restore {
		t.Errorf("restores %+v, want %+v", got, *restore.Restore)
	}

	if err := rt.DeleteCheckpoint(t.Context(), restore.Pod, ref); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		what string
		pod  runtime.PodRef
		ref  string
	}{
		{"not named by digest", restore.Pod, "reg.example/ckpt/suite/pod-run:latest"},
		{"another namespace's", runtime.PodRef{UID: "x", Namespace: "other", Name: "pod-run"}, ref},
		{"another pod's", other.Pod, ref},
	} {
		if err := rt.DeleteCheckpoint(t.Context(), tc.pod, tc.ref); !errdefs.IsInvalidArgument(err) {
			t.Errorf("a checkpoint %s deleted: %v", tc.what, err)
		}
	}
	if got := rt.DeletedCheckpoints(); !slices.Equal(got, []string{ref}) {
		t.Errorf("deleted %v, want [%s]", got, ref)
	}
}

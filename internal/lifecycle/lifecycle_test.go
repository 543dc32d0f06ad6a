package lifecycle

import (
	"context"
	goruntime "runtime"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"
)

// TestGroupWaitsForWhatItStarted: Wait returns only once every goroutine Go
// started and every Join has left.
func TestGroupWaitsForWhatItStarted(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(g *Group, release <-chan struct{}) bool
	}{
		{"Go", func(g *Group, release <-chan struct{}) bool {
			return g.Go(func() { <-release })
		}},
		{"Join", func(g *Group, release <-chan struct{}) bool {
			leave, ok := g.Join()
			if ok {
				go func() { <-release; leave() }()
			}
			return ok
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var g Group
			release := make(chan struct{})
			if !tc.start(&g, release) {
				t.Fatal("an open group refused")
			}
			g.Close()
			waited := make(chan struct{})
			go func() { g.Wait(); close(waited) }()
			select {
			case <-waited:
				t.Fatal("Wait returned while a goroutine of the group still ran")
			case <-time.After(10 * time.Millisecond):
			}
			close(release)
			<-waited
		})
	}
}

// TestClosedGroupStartsNothing: once closed, Go runs nothing and Join
// counts nothing, and both say so.
func TestClosedGroupStartsNothing(t *testing.T) {
	var g Group
	if g.Closed() {
		t.Fatal("a new group is closed")
	}
	g.Close()
	if !g.Closed() {
		t.Fatal("Closed is false after Close")
	}
	ran := make(chan struct{}, 1)
	if g.Go(func() { ran <- struct{}{} }) {
		t.Error("Go on a closed group returned true")
	}
	if leave, ok := g.Join(); ok || leave != nil {
		t.Errorf("Join on a closed group = (%v, %v), want (nil, false)", leave != nil, ok)
	}
	g.Wait() // nothing counted: returns at once
	select {
	case <-ran:
		t.Error("Go on a closed group ran f")
	default:
	}
}

// TestSleep: true when the clock reaches d, false when the context ends
// first; a zero d still waits for the fake clock's next step.
func TestSleep(t *testing.T) {
	for _, tc := range []struct {
		name   string
		d      time.Duration
		cancel bool // cancel the context instead of stepping the clock
		want   bool
	}{
		{"clock reaches d", time.Second, false, true},
		{"context ends first", time.Hour, true, false},
		{"zero on a fake clock waits for a step", 0, false, true},
		{"zero, context ends", 0, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fc := clocktesting.NewFakeClock(time.Unix(0, 0))
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			got := make(chan bool, 1)
			go func() { got <- Sleep(ctx, fc, tc.d) }()
			for !fc.HasWaiters() {
				goruntime.Gosched()
			}
			select {
			case v := <-got:
				t.Fatalf("Sleep returned %v before the clock moved or the context ended", v)
			default:
			}
			if tc.cancel {
				cancel()
			} else {
				fc.Step(tc.d)
			}
			if v := <-got; v != tc.want {
				t.Errorf("Sleep = %v, want %v", v, tc.want)
			}
		})
	}
}

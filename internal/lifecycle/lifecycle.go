// Package lifecycle holds what a long-lived object (the virtual node's
// provider, the node runtime, the image manager, the fake runtime) needs to
// stop cleanly: a Group that counts the goroutines it starts so that its
// Close can wait for them, and Sleep, a wait on an injected clock that ends
// with its context.
package lifecycle

import (
	"context"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Group counts the goroutines an owner starts in the background, so that
// the owner's Close can wait for them, and starts none once closed. The
// zero Group is ready to use. Its lock is taken last: an owner may call Go
// while holding its own locks.
type Group struct {
	mu     sync.Mutex
	closed bool
	wg     sync.WaitGroup
}

// Go runs f in a goroutine Wait waits for; once the group is closed it does
// not run f and returns false.
func (g *Group) Go(f func()) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.wg.Go(f)
	return true
}

// Join counts the calling goroutine (an owner's Run) in the group until it
// calls leave. Once the group is closed it counts nothing and returns
// ok false (and a nil leave).
func (g *Group) Join() (leave func(), ok bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil, false
	}
	g.wg.Add(1)
	return g.wg.Done, true
}

// Close makes Go and Join refuse from now on. It does not wait, so that
// the owner can stop what runs (cancel a context, stop timers) before it
// calls Wait.
func (g *Group) Close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
}

// Closed reports whether Close was called.
func (g *Group) Closed() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.closed
}

// Wait waits for every goroutine Go started and every Join to leave. Call
// it after Close: nothing is added to the group once Wait may be waiting.
func (g *Group) Wait() { g.wg.Wait() }

// Sleep waits d on c; false when ctx ended first. d ≤ 0 is a timer like any
// other: a real clock fires it at once, a fake one at its next step.
func Sleep(ctx context.Context, c clock.Clock, d time.Duration) bool {
	t := c.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-ctx.Done():
		return false
	}
}

package runtime

import (
	"context"
	"testing"
)

// TestHub: watchers get what is published, a watcher whose context ends or
// whose buffer overflows is dropped (its channel closed), and Close ends
// every watcher.
func TestHub(t *testing.T) {
	closed := func(ch <-chan Event) bool {
		for {
			select {
			case _, ok := <-ch:
				if !ok {
					return true
				}
			default:
				return false
			}
		}
	}
	for _, tc := range []struct {
		name string
		// run returns the watcher's channel after acting on the hub, and
		// whether it should be closed.
		run func(t *testing.T, h *Hub) (<-chan Event, bool)
	}{
		{"delivers", func(t *testing.T, h *Hub) (<-chan Event, bool) {
			ch := h.Subscribe(t.Context())
			h.Publish(Event{Type: EventReady})
			if ev := <-ch; ev.Type != EventReady {
				t.Fatalf("got %+v", ev)
			}
			return ch, false
		}},
		{"context ends", func(t *testing.T, h *Hub) (<-chan Event, bool) {
			ctx, cancel := context.WithCancel(t.Context())
			ch := h.Subscribe(ctx)
			cancel()
			for range ch { // closed by the context's AfterFunc
			}
			return ch, true
		}},
		{"buffer overflows", func(t *testing.T, h *Hub) (<-chan Event, bool) {
			ch := h.Subscribe(t.Context())
			for range 3 {
				h.Publish(Event{Type: EventSlot})
			}
			return ch, true
		}},
		{"close", func(t *testing.T, h *Hub) (<-chan Event, bool) {
			ch := h.Subscribe(t.Context())
			h.Close()
			return ch, true
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch, wantClosed := tc.run(t, NewHub(2))
			if got := closed(ch); got != wantClosed {
				t.Fatalf("watcher closed = %v, want %v", got, wantClosed)
			}
		})
	}
}

package runtime

import (
	"context"
	"sync"
)

// Hub fans events out to watchers. Publish never blocks: a watcher whose
// buffer is full is dropped (its channel closed) and must watch again, as a
// Kubernetes watch would. Implementations call Subscribe and Publish under
// the lock that guards their slots, so a snapshot and the events after it
// line up.
type Hub struct {
	buffer int

	// mu guards subs.
	mu   sync.Mutex
	subs map[chan Event]struct{}
}

// NewHub returns a Hub whose watchers buffer up to buffer events.
func NewHub(buffer int) *Hub {
	return &Hub{buffer: buffer, subs: map[chan Event]struct{}{}}
}

// Subscribe adds a watcher that ends when ctx does.
func (h *Hub) Subscribe(ctx context.Context) <-chan Event {
	ch := make(chan Event, h.buffer)
	h.mu.Lock()
	h.subs[ch] = struct{}{}
	h.mu.Unlock()
	context.AfterFunc(ctx, func() { h.drop(ch) })
	return ch
}

// Publish delivers ev to every watcher.
func (h *Hub) Publish(ev Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs {
		select {
		case ch <- ev:
		default:
			delete(h.subs, ch)
			close(ch)
		}
	}
}

// Close ends every watcher.
func (h *Hub) Close() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for ch := range h.subs {
		delete(h.subs, ch)
		close(ch)
	}
}

func (h *Hub) drop(ch chan Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.subs[ch]; ok {
		delete(h.subs, ch)
		close(ch)
	}
}

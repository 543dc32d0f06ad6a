package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sandman-dev/sandman/runtime"
)

// turnover times the steps of a slot's turnover in the oversubscribed
// burst on the virtual node, from the trainer's side (its delete, the
// Ready it sees) and the fake agents' own events (same process, same
// clock): delete → the agent starts the release (the apiserver,
// virtual-kubelet's informer and DeletePod, the release call); the slot
// warm again → the next bind starts on it (the watch stream to the pool,
// its dispatch); the agent's ready → the trainer sees the pod Ready (the
// event to sandman-vk, its status queue, virtual-kubelet's status write,
// the trainer's informer).
type turnover struct {
	mu         sync.Mutex
	deleted    map[string]time.Time // pod name → the trainer's delete call
	deleteDone map[string]time.Time // pod name → that call returned
	goneSeen   map[string]time.Time // pod name → the trainer's informer saw it gone
	released   map[string]time.Time // pod name → its slot began releasing
	agentReady map[string]time.Time // pod name → the agent's ready event
	warmAt     map[string]time.Time // node/slot → warm again after a release
	recycled   map[string]bool      // node/slot → releasing, not warm yet
	warmToBind durations
	lost       int // watch streams that ended early (events missed)
}

func newTurnover() *turnover {
	return &turnover{deleted: map[string]time.Time{}, deleteDone: map[string]time.Time{}, goneSeen: map[string]time.Time{}, released: map[string]time.Time{}, agentReady: map[string]time.Time{},
		warmAt: map[string]time.Time{}, recycled: map[string]bool{}}
}

// watch follows one agent's events until ctx ends.
func (t *turnover) watch(ctx context.Context, node string, rt runtime.Runtime) error {
	_, ch, err := rt.Watch(ctx)
	if err != nil {
		return err
	}
	go func() {
		for ev := range ch {
			t.event(node, ev)
		}
		if ctx.Err() == nil {
			t.mu.Lock()
			t.lost++
			t.mu.Unlock()
		}
	}()
	return nil
}

func (t *turnover) event(node string, ev runtime.Event) {
	key := node + "/" + ev.Slot.ID
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case ev.Type == runtime.EventReady:
		t.agentReady[ev.Slot.Pod.Name] = ev.Time
	case ev.Type != runtime.EventSlot:
	case ev.Slot.State == runtime.StateReleasing:
		t.released[ev.Slot.Pod.Name] = ev.Time
		t.recycled[key] = true
	case ev.Slot.State == runtime.StateWarm && t.recycled[key]:
		delete(t.recycled, key)
		t.warmAt[key] = ev.Time
	case ev.Slot.State == runtime.StateBinding:
		if w, ok := t.warmAt[key]; ok {
			t.warmToBind = append(t.warmToBind, ev.Time.Sub(w))
			delete(t.warmAt, key)
		}
	}
}

func (t *turnover) deleting(name string, at, done time.Time) {
	t.mu.Lock()
	t.deleted[name], t.deleteDone[name] = at, done
	t.mu.Unlock()
}

func (t *turnover) gone(name string, at time.Time) {
	t.mu.Lock()
	t.goneSeen[name] = at
	t.mu.Unlock()
}

// summary says where a turnover's time went, given when the trainer saw
// each pod Ready.
func (t *turnover) summary(seenReady map[string]time.Time) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var delToRelease, readyToSeen, delCall, goneLag durations
	for name, at := range t.deleteDone {
		delCall = append(delCall, at.Sub(t.deleted[name]))
		if g, ok := t.goneSeen[name]; ok {
			goneLag = append(goneLag, g.Sub(at))
		}
	}
	for name, at := range t.deleted {
		if r, ok := t.released[name]; ok {
			delToRelease = append(delToRelease, r.Sub(at))
		}
	}
	for name, at := range seenReady {
		if r, ok := t.agentReady[name]; ok {
			readyToSeen = append(readyToSeen, at.Sub(r))
		}
	}
	return fmt.Sprintf("turnover: the delete call p50 %s p99 %s, its return → the trainer's informer sees the pod gone p50 %s p99 %s; "+
		"delete → release at the agent p50 %s p99 %s (%d); slot warm → next bind p50 %s p99 %s (%d); "+
		"agent ready → trainer sees Ready p50 %s p99 %s (%d); %d watch streams ended early",
		ms(delCall.p50()), ms(delCall.p99()), ms(goneLag.p50()), ms(goneLag.p99()),
		ms(delToRelease.p50()), ms(delToRelease.p99()), len(delToRelease),
		ms(t.warmToBind.p50()), ms(t.warmToBind.p99()), len(t.warmToBind),
		ms(readyToSeen.p50()), ms(readyToSeen.p99()), len(readyToSeen), t.lost)
}

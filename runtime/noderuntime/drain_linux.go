package noderuntime

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"

	ctrd "github.com/containerd/containerd/v2/client"

	"github.com/sandman-dev/sandman/runtime"
)

// Drain empties the node for good or for a while (the worker cordoned,
// sandman uninstalled): binds are refused with why, every bound sandbox is
// moved away (a gVisor one, when the node has a checkpoint repository:
// moveOut, a Moved exit) or stopped and released with an Evicted exit that
// says why, and the warm and hot slots are torn down. The API keeps serving, so the virtual node
// sees the evictions and an empty node. Undrain takes binds again.
func (r *Runtime) Drain(ctx context.Context, why string) error {
	msg := fmt.Sprintf("node agent %s is draining: %s", r.cfg.Node, why)
	ctx = r.nsCtx(ctx)
	r.mu.Lock()
	first := r.draining == ""
	r.draining = msg
	r.hub.Publish(runtime.Event{Type: runtime.EventDraining, Time: r.cfg.Clock.Now(), Message: msg})
	var bound []*slot
	for _, s := range r.slots {
		switch {
		case (s.State == runtime.StateBound || s.State == runtime.StatePaused) && s.Pod != nil:
			if s.evicted == "" && r.cfg.CheckpointRepository == "" {
				s.evicted = msg
			}
			bound = append(bound, s)
		}
	}
	r.mu.Unlock()
	if first {
		r.log.Warn("draining", "why", why, "bound", len(bound))
	}
	var errs []error
	for _, s := range bound {
		r.mu.Lock()
		if s.State != runtime.StateBound && s.State != runtime.StatePaused || s.Pod == nil {
			r.mu.Unlock()
			continue
		}
		uid := s.Pod.UID
		evictMsg := msg
		if r.cfg.CheckpointRepository != "" {
			r.mu.Unlock()
			_, err := r.moveOut(ctx, s, why)
			if err == nil {
				if err := r.Release(ctx, uid, 0); err != nil {
					errs = append(errs, err)
				}
				continue
			}
			evictMsg = fmt.Sprintf("%s (it could not be moved: %v)", msg, err)
			r.mu.Lock()
			if s.State != runtime.StateBound && s.State != runtime.StatePaused || s.Pod == nil || s.Pod.UID != uid {
				r.mu.Unlock()
				continue
			}
		}
		if s.evicted == "" {
			s.evicted = evictMsg
		}
		ids := slices.Clone(s.containers)
		main := ""
		if len(ids) > 0 {
			main = strings.TrimPrefix(ids[0], s.ID+"-")
		}
		// The exit the virtual node reads, before the release hides it.
		r.hub.Publish(runtime.Event{Type: runtime.EventExit, Time: r.cfg.Clock.Now(), Slot: s.Slot.Clone(),
			Container: main, ExitCode: 128 + int(syscall.SIGKILL), Reason: runtime.ReasonEvicted, Message: evictMsg})
		r.mu.Unlock()
		r.metrics.failures.WithLabelValues(runtime.ReasonEvicted).Inc()
		for _, id := range ids {
			if c, err := r.client.LoadContainer(ctx, id); err == nil {
				if task, err := c.Task(ctx, nil); err == nil {
					_ = task.Kill(ctx, syscall.SIGKILL, ctrd.WithKillAll)
				}
			}
		}
		if err := r.Release(ctx, uid, 0); err != nil {
			errs = append(errs, err)
		}
	}
	// Idle slots (those released above among them) are torn down by Run
	// while the drain lasts: see shedIdle.
	r.wake()
	return errors.Join(errs...)
}

// Undrain takes binds again; warm slots are made anew.
func (r *Runtime) Undrain() {
	r.mu.Lock()
	was := r.draining
	r.draining = ""
	r.hub.Publish(runtime.Event{Type: runtime.EventDraining, Time: r.cfg.Clock.Now()})
	r.mu.Unlock()
	if was != "" {
		r.log.Info("drain ended; taking binds again")
	}
	r.wake()
}

// shedIdle tears down warm and hot slots while the node drains (Run calls
// it each round): slots that releases make warm go as they appear.
func (r *Runtime) shedIdle(ctx context.Context, wg *sync.WaitGroup) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.draining == "" {
		return
	}
	for id, s := range r.slots {
		if s.State == runtime.StateWarm && !s.heating || s.State == runtime.StateHot {
			s.State = runtime.StateReleasing
			delete(r.slots, id)
			r.hub.Publish(runtime.Event{Type: runtime.EventSlot, Time: r.cfg.Clock.Now(), Slot: s.Slot.Clone()})
			wg.Go(func() {
				err := errors.Join(r.removeContainers(ctx, s, 0), r.destroySlot(ctx, s.ID, s.netns.GetPath(), s.dir),
					r.leaveGroup(ctx, s.group))
				if err != nil {
					r.log.Error("drain: tear down an idle slot", "slot", s.ID, "err", err)
				}
				// Watchers drop the draining node's idle slots on this.
				r.mu.Lock()
				r.hub.Publish(runtime.Event{Type: runtime.EventDraining, Time: r.cfg.Clock.Now(), Message: r.draining})
				r.mu.Unlock()
			})
		}
	}
}

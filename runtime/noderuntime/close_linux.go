package noderuntime

import (
	"context"
	"errors"
	"maps"
	"slices"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sandman-dev/sandman/runtime"
)

// Close stops Run and the runtime's watches and waits for them, tears down
// every warm and hot slot and ends watches; bound sandboxes keep running
// for the next agent to adopt.
func (r *Runtime) Close(ctx context.Context) error {
	r.end()
	// A release under way (the overlay unmount of a sandbox that wrote a
	// lot may wait seconds for the disk) finishes first: stopped halfway it
	// would leave its containers to the next agent's recovery.
	released := make(chan struct{})
	go func() { r.releases.Wait(); close(released) }()
	select {
	case <-released:
	case <-ctx.Done():
		r.log.Warn("stopping with releases still under way", "err", ctx.Err())
	}
	ctx = r.nsCtx(ctx)
	r.mu.Lock()
	var warm []*slot
	for id, s := range r.slots {
		// Hot sandboxes and broken slots belong to no pod: they go too.
		if s.State == runtime.StateWarm || s.State == runtime.StateHot || s.State == runtime.StateBroken {
			s.State = runtime.StateReleasing
			warm = append(warm, s)
			delete(r.slots, id)
		}
	}
	r.mu.Unlock()
	start := time.Now()
	errs := []error{r.tearDown(ctx, warm)}
	if r.grouped() {
		// And only those: a holder that a bind or a hot start finishing as
		// the agent stops started for a group whose slots are gone would
		// be left to the next agent's recovery.
		r.mu.Lock()
		keep := map[string]bool{}
		for _, g := range r.groups {
			keep[g.holder] = g.holder != ""
		}
		r.mu.Unlock()
		errs = append(errs, r.removeHolders(ctx, keep))
	}
	r.reapShims()
	// How long a stop takes with a node's worth of slots: the agent's pod
	// has its termination grace period for all of it.
	r.log.Info("slots torn down", "slots", len(warm), "seconds", time.Since(start).Seconds())
	r.hub.Close()
	return errors.Join(errs...)
}

// teardownWorkers is how many slots Close and Destroy release or tear
// down at once:
// one at a time, a node of a hundred warm slots (each a CNI delete, an
// unmount and a netns removal) outlasts the grace period a stopping pod
// gets, and what is not removed by then is left behind.
const teardownWorkers = 8

// tearDown removes slots that are no longer in r.slots: their containers
// and what earlier failed removals left, their network and
// directory, and their place in their shim group. A group with bound
// sandboxes keeps its holder for the next agent.
func (r *Runtime) tearDown(ctx context.Context, slots []*slot) error {
	errs := make([][]error, len(slots))
	var g errgroup.Group
	g.SetLimit(teardownWorkers)
	for i, s := range slots {
		g.Go(func() error {
			errs[i] = append(errs[i], r.removeContainers(ctx, s, 0))
			for _, id := range s.leftovers {
				errs[i] = append(errs[i], r.removeLeftover(ctx, id))
			}
			errs[i] = append(errs[i], r.destroySlot(ctx, s.ID, s.netns.GetPath(), s.dir), r.leaveGroup(ctx, s.group))
			return nil
		})
	}
	_ = g.Wait()
	return errors.Join(slices.Concat(errs...)...)
}

// Destroy stops Run and the runtime's watches and waits for them, releases
// every bound pod and tears down every slot: nothing of this runtime is
// left on the node.
func (r *Runtime) Destroy(ctx context.Context) error {
	r.end()
	r.mu.Lock()
	uids := slices.Collect(maps.Keys(r.byPod))
	r.mu.Unlock()
	errs := make([]error, len(uids))
	var g errgroup.Group
	g.SetLimit(teardownWorkers)
	for i, uid := range uids {
		g.Go(func() error { errs[i] = r.Release(ctx, uid, 0); return nil })
	}
	_ = g.Wait()
	ctx = r.nsCtx(ctx)
	r.mu.Lock()
	all := slices.Collect(maps.Values(r.slots))
	clear(r.slots)
	for _, s := range all {
		s.State = runtime.StateReleasing // hot sandboxes: no cool-down
	}
	r.mu.Unlock()
	errs = append(errs, r.tearDown(ctx, all))
	// Every group is empty now; holders whose removal failed or that no
	// group knew are looked up by their labels.
	errs = append(errs, r.removeHolders(ctx, nil))
	r.reapShims()
	r.hub.Close()
	return errors.Join(errs...)
}

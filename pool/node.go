package pool

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
)

// node is one node agent as the pool tracks it.
type node struct {
	name   string
	rt     runtime.Runtime
	cancel context.CancelFunc
	done   chan struct{}
	// snapshots holds a token per snapshot running on the node
	// (capacity SnapshotsPerNode).
	snapshots chan struct{}

	// Guarded by Pool.mu:
	// healthy: the watch stream is up.
	healthy bool
	// synced: an inventory arrived at least once.
	synced bool
	// since is when healthy last changed; err why it is unhealthy.
	since time.Time
	err   error
	inv   runtime.Inventory
	slots map[string]runtime.Slot // by slot ID
	// hot counts hot slots by image; images are ready on the node (its
	// report, plus the images of its bound slots).
	hot    map[string]int
	images map[string]bool
	// snapshotted are the images snapshots made on the node, by tag and
	// by digest: the agent keeps them, and a fork names its image by
	// digest, which the agent's image names do not show.
	snapshotted map[string]bool
	reported    []string
	inflight    int
	binds       bindRing
	// rewatch ends the current watch stream (guarded by Pool.mu).
	rewatch context.CancelFunc
	// free counts warm and hot slots, used the resources of binding, bound
	// and releasing slots (both kept by recountLocked); unseen and
	// unseenRes are the placements on this node its inventory does not
	// show yet (kept by the pool's placement helpers). Placement reads
	// these instead of walking every slot and placement for every pod.
	free      int
	used      runtime.Resources
	unseen    int
	unseenRes runtime.Resources
}

func (n *node) stop() {
	n.cancel()
	<-n.done
}

func (n *node) markUnhealthyLocked(now time.Time, err error) {
	if n.healthy {
		n.since = now
	}
	n.healthy, n.err = false, err
}

// suspectLocked: a call to the node failed as if the agent were gone. The
// node takes no pods until a fresh watch proves it answers: the current
// stream is ended, so an agent that is fine is healthy again after one
// reconnect, and one that is gone stays unhealthy (and its pods are lost
// after LostAfter).
func (n *node) suspectLocked(now time.Time, err error) {
	n.markUnhealthyLocked(now, err)
	if n.rewatch != nil {
		n.rewatch()
	}
}

// applyInventoryLocked replaces what the pool knows of the node.
func (n *node) applyInventoryLocked(inv runtime.Inventory) {
	n.inv = inv
	n.slots = map[string]runtime.Slot{}
	for _, s := range inv.Slots {
		n.slots[s.ID] = s
	}
	n.reported = inv.ReadyImages
	n.recountLocked()
}

// recountLocked rebuilds the hot and image sets from the slots and the
// node's report. Image names are normalized (busybox and
// docker.io/library/busybox:latest are one image).
func (n *node) recountLocked() {
	n.hot = map[string]int{}
	n.images = map[string]bool{}
	for _, img := range n.reported {
		n.images[imageKey(img)] = true
	}
	n.free, n.used = 0, runtime.Resources{}
	slots := make([]runtime.Slot, 0, len(n.slots))
	for _, s := range n.slots {
		slots = append(slots, s)
		switch s.State {
		case runtime.StateWarm, runtime.StateHot:
			n.free++
		case runtime.StateBinding, runtime.StateBound, runtime.StateReleasing:
			n.used = n.used.Add(s.Resources)
		}
		if s.Image == "" {
			continue
		}
		key := imageKey(s.Image)
		if s.State == runtime.StateHot {
			n.hot[key]++
		}
		n.images[key] = true
	}
	n.inv.Slots = slots
}

// imageKeys memoizes imageKey: a pool sees few distinct images.
var imageKeys sync.Map

// imageKey is ref's normalized name, or ref when it does not parse.
func imageKey(ref string) string {
	if v, ok := imageKeys.Load(ref); ok {
		return v.(string)
	}
	key, err := runtime.NormalizeImage(ref)
	if err != nil {
		key = ref
	}
	imageKeys.Store(ref, key)
	return key
}

// freeSlotsLocked: warm and hot slots not yet taken by a reservation the
// node's inventory does not show yet.
func (n *node) freeSlotsLocked() int { return n.free - n.unseen }

// fitsLocked: the node's resources hold want on top of what its slots and
// unseen reservations hold.
func (n *node) fitsLocked(want runtime.Resources) bool {
	capa := n.inv.Capacity.Resources
	total := n.used.Add(n.unseenRes).Add(want)
	return (capa.MilliCPU == 0 || total.MilliCPU <= capa.MilliCPU) &&
		(capa.MemoryBytes == 0 || total.MemoryBytes <= capa.MemoryBytes)
}

// hasImageLocked: image (normalized) is ready on the node.
func (n *node) hasImageLocked(image string) bool {
	return image != "" && (n.images[image] || n.snapshotted[image])
}

// AddNode starts following a node agent until ctx ends or Run returns.
// Adding a name again replaces it; adding one after Run returned does
// nothing.
func (p *Pool) AddNode(ctx context.Context, name string, rt runtime.Runtime) {
	ctx, cancel := context.WithCancel(ctx)
	n := &node{name: name, rt: rt, cancel: cancel, done: make(chan struct{}), since: p.cfg.Clock.Now(),
		snapshots: make(chan struct{}, p.cfg.SnapshotsPerNode),
		slots:     map[string]runtime.Slot{}, hot: map[string]int{}, images: map[string]bool{}, snapshotted: map[string]bool{}}
	// Replaced in one step: the node's pods never see it absent (which
	// would report them lost).
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		cancel()
		return
	}
	old := p.nodes[name]
	p.nodes[name] = n
	p.mu.Unlock()
	if old != nil {
		old.stop()
	}
	go p.follow(ctx, n)
}

// RemoveNode stops following a node agent. Its pods are reported lost after
// LostAfter unless it is added again.
func (p *Pool) RemoveNode(name string) {
	p.mu.Lock()
	n := p.nodes[name]
	delete(p.nodes, name)
	p.changedLocked()
	p.mu.Unlock()
	if n != nil {
		n.stop()
	}
}

// Unsynced lists the node agents whose inventory has not arrived yet.
func (p *Pool) Unsynced() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, n := range p.sortedNodesLocked() {
		if !n.synced {
			out = append(out, n.name)
		}
	}
	return out
}

// LostAfter is how long a node agent may be unreachable before its pods are
// reported lost.
func (p *Pool) LostAfter() time.Duration { return p.cfg.LostAfter }

// NodeNames lists the node agents the pool follows.
func (p *Pool) NodeNames() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []string
	for _, n := range p.sortedNodesLocked() {
		out = append(out, n.name)
	}
	return out
}

// WaitSynced waits until every node agent has reported its inventory once
// or ctx ends (a node agent that cannot be reached does not hold up the
// others past ctx).
func (p *Pool) WaitSynced(ctx context.Context) error {
	for {
		p.mu.Lock()
		all := true
		for _, n := range p.nodes {
			all = all && n.synced
		}
		changed := p.changed
		p.mu.Unlock()
		if all {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

// follow keeps a watch on a node agent, reconnecting with backoff.
func (p *Pool) follow(ctx context.Context, n *node) {
	defer close(n.done)
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		wctx, cancel := context.WithCancel(ctx)
		p.mu.Lock()
		n.rewatch = cancel
		p.mu.Unlock()
		inv, events, err := n.rt.Watch(wctx)
		if err != nil {
			cancel()
			p.mu.Lock()
			n.markUnhealthyLocked(p.cfg.Clock.Now(), err)
			p.mu.Unlock()
			limit := 10 * time.Second
			if errors.Is(err, runtime.ErrNotServing) {
				// It answers: it is starting (a rolling update) and serves
				// in a moment; 10 s more would leave its slots unused.
				limit = time.Second
				p.log.Info("node agent not serving yet", "node", n.name, "err", err)
			} else {
				p.log.Warn("node agent unreachable", "node", n.name, "err", err)
			}
			backoff = min(backoff, limit)
			t := p.cfg.Clock.NewTimer(backoff)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C():
			}
			backoff = min(2*backoff, limit)
			continue
		}
		backoff = 100 * time.Millisecond
		p.resync(n, inv)
		for ev := range events {
			p.apply(n, ev)
		}
		cancel()
		p.mu.Lock()
		n.markUnhealthyLocked(p.cfg.Clock.Now(), errWatchEnded)
		p.mu.Unlock()
	}
}

// errWatchEnded is why a node is unhealthy after its watch stream closed
// without an error; the loop reconnects.
var errWatchEnded = errors.New("watch stream ended")

// resync takes a fresh inventory: pods the pool placed on the node that it
// no longer holds (and are not still binding) are lost.
func (p *Pool) resync(n *node, inv runtime.Inventory) {
	now := p.cfg.Clock.Now()
	p.mu.Lock()
	n.applyInventoryLocked(inv)
	n.healthy, n.synced, n.err, n.since = true, true, nil, now
	p.changedLocked()
	held := map[string]runtime.Slot{}
	for _, s := range n.slots {
		if s.Pod != nil && (s.State == runtime.StateBinding || s.State == runtime.StateBound || s.State == runtime.StatePaused) {
			held[s.Pod.UID] = s
		}
	}
	var updates []Update
	for uid, pl := range p.placed {
		if pl.node != n.name || pl.binding {
			continue
		}
		if s, ok := held[uid]; ok {
			pl.markSeenLocked()
			p.setPausedLocked(pl, s.State == runtime.StatePaused)
			if s.Ready {
				updates = append(updates, Update{Kind: Ready, UID: uid, Node: n.name, Slot: s.Clone(), Time: now})
			}
			continue
		}
		p.unplaceLocked(uid)
		updates = append(updates, Update{Kind: Lost, UID: uid, Node: n.name, Time: now, Reason: podcontract.ReasonSandboxLost,
			Message: "node agent " + n.name + " no longer holds the sandbox (it restarted without it)"})
	}
	p.mu.Unlock()
	for _, u := range updates {
		p.cfg.OnUpdate(u)
	}
	p.nudge()
}

// apply folds one node event into the inventory and reports what concerns
// placed pods.
func (p *Pool) apply(n *node, ev runtime.Event) {
	var u *Update
	p.mu.Lock()
	switch ev.Type {
	case runtime.EventSlot:
		s := ev.Slot
		n.slots[s.ID] = s.Clone()
		n.recountLocked()
		if s.Pod != nil {
			if pl, ok := p.placed[s.Pod.UID]; ok && pl.node == n.name {
				switch s.State {
				case runtime.StateBinding, runtime.StateBound, runtime.StatePaused:
					pl.markSeenLocked()
					p.setPausedLocked(pl, s.State == runtime.StatePaused)
				}
			}
		}
	case runtime.EventImages:
		n.reported = ev.Images
		n.recountLocked()
	case runtime.EventDraining:
		if ev.Message != "" && n.inv.Draining == "" {
			p.log.Info("node agent draining", "node", n.name, "why", ev.Message)
		}
		n.inv.Draining = ev.Message
		if ev.Message != "" {
			// A draining agent tears its idle slots down and says so.
			for id, s := range n.slots {
				if s.Pod == nil && s.State == runtime.StateReleasing {
					delete(n.slots, id)
				}
			}
			n.recountLocked()
		}
	case runtime.EventReady:
		if s := ev.Slot; s.Pod != nil {
			if cur, ok := n.slots[s.ID]; ok {
				cur.Ready = true
				n.slots[s.ID] = cur
			}
			if pl, ok := p.placed[s.Pod.UID]; ok && pl.node == n.name {
				u = &Update{Kind: Ready, UID: s.Pod.UID, Node: n.name, Slot: s.Clone(), Time: ev.Time}
			}
		}
	case runtime.EventExit:
		if s := ev.Slot; s.Pod != nil {
			if pl, ok := p.placed[s.Pod.UID]; ok && pl.node == n.name {
				u = &Update{Kind: Exited, UID: s.Pod.UID, Node: n.name, Slot: s.Clone(), Time: ev.Time,
					Container: ev.Container, ExitCode: ev.ExitCode, Reason: ev.Reason, Message: ev.Message}
				if ev.Reason == runtime.ReasonMoved && ev.Moved != nil {
					// The node lets the slot go next: the pod is placed
					// nowhere until it is submitted again.
					u.Kind, u.Moved = Moved, ev.Moved
					p.unplaceLocked(s.Pod.UID)
				}
			}
		}
	}
	p.mu.Unlock()
	if u != nil {
		p.cfg.OnUpdate(*u)
	}
	if ev.Type == runtime.EventSlot {
		switch ev.Slot.State {
		case runtime.StateWarm, runtime.StateHot:
			p.nudge()
		}
	}
}

// checkLost reports the pods of node agents unreachable for LostAfter.
func (p *Pool) checkLost() {
	now := p.cfg.Clock.Now()
	var updates []Update
	p.mu.Lock()
	for uid, pl := range p.placed {
		if _, ok := p.nodes[pl.node]; !ok && !pl.binding {
			p.unplaceLocked(uid)
			updates = append(updates, Update{Kind: Lost, UID: uid, Node: pl.node, Time: now, Reason: podcontract.ReasonNodeLost,
				Message: "node agent " + pl.node + " left the pool"})
		}
	}
	for _, n := range p.nodes {
		if n.healthy || now.Sub(n.since) < p.cfg.LostAfter {
			continue
		}
		lost := 0
		defer func() {
			if lost > 0 {
				p.log.Warn("node agent lost: its pods are reported lost, their sandboxes may still run on the worker until the agent returns (then they are released) or the worker is drained", "node", n.name, "pods", lost, "since", n.since)
			}
		}()
		for uid, pl := range p.placed {
			if pl.node != n.name || pl.binding {
				continue
			}
			p.unplaceLocked(uid)
			msg := "node agent " + n.name + " has been unreachable since " + n.since.UTC().Format(time.RFC3339)
			if n.err != nil {
				msg += ": " + n.err.Error()
			}
			updates = append(updates, Update{Kind: Lost, UID: uid, Node: n.name, Time: now, Reason: podcontract.ReasonNodeLost, Message: msg})
			lost++
		}
	}
	p.mu.Unlock()
	for _, u := range updates {
		p.cfg.OnUpdate(u)
	}
}

// WaitBindsSettled waits until no node agent reports a slot still binding,
// or ctx ends. A new leader calls it before it adopts what the agents hold:
// the binds its predecessor left running (cancelled when it stopped or
// died, or about to finish) end bound, and are adopted, or warm again, and
// their pods are placed anew, never both. It polls every interval on the
// pool's clock.
func (p *Pool) WaitBindsSettled(ctx context.Context, interval time.Duration) error {
	t := p.cfg.Clock.NewTicker(interval)
	defer t.Stop()
	for {
		if p.bindingSlots() == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d slots still binding: %w", p.bindingSlots(), ctx.Err())
		case <-t.C():
		}
	}
}

// bindingSlots counts the slots the node agents report binding.
func (p *Pool) bindingSlots() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, nd := range p.nodes {
		for _, s := range nd.slots {
			if s.State == runtime.StateBinding {
				n++
			}
		}
	}
	return n
}

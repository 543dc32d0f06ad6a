package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"k8s.io/utils/clock"

	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
)

// Config configures a Pool.
type Config struct {
	// Name is the pool's name (sandman.io/pool), for messages.
	Name string
	// MaxQueued bounds the admission queue (default 100,000).
	MaxQueued int
	// MaxQueuedPerNamespace bounds the pods of one namespace in the
	// admission queue, so one tenant cannot fill it (default MaxQueued: no
	// bound beyond MaxQueued; more than MaxQueued is refused).
	MaxQueuedPerNamespace int
	// NamespaceWeights are the namespaces' weights in the admission
	// queue's fair share (weighted max-min: a freed slot goes to the
	// waiting namespace with the fewest placements for its weight). A
	// namespace not listed weighs 1; a weight must be 1 to 1,000,000.
	NamespaceWeights map[string]int
	// BindsPerNode bounds binds in flight on one node (default 16).
	BindsPerNode int
	// SnapshotsPerNode bounds the snapshots taken at once on one node
	// (default 2): more wait their turn (see Snapshot).
	SnapshotsPerNode int
	// BindTimeout bounds one bind call (default 2 minutes: a cold image pull
	// happens inside it).
	BindTimeout time.Duration
	// LostAfter is how long a node agent may be unreachable before the pods
	// it held are reported lost (default 2 minutes).
	LostAfter time.Duration
	// OnUpdate receives every change of a pod's placement. It is called from
	// the pool's goroutines, one update at a time, never under the pool's
	// lock (so it may call the pool), and must not block.
	OnUpdate func(Update)
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Clock tells the time and runs the pool's ticker and reconnect
	// back-off (default clock.RealClock).
	Clock clock.WithTicker
}

// Request asks for a slot for one pod. Admission is fair first across
// namespaces (Bind.Pod.Namespace, weighted by Config.NamespaceWeights),
// then across the jobs inside a namespace.
type Request struct {
	Bind runtime.BindRequest
	// Job is the trainer job the pod belongs to (label sandman.io/job),
	// within its namespace.
	Job string
}

// UpdateKind says what an Update reports.
type UpdateKind string

const (
	// Queued: no node can take the pod now; it waits in the admission queue.
	Queued UpdateKind = "queued"
	// Placing: a node was chosen and the bind is running.
	Placing UpdateKind = "placing"
	// Bound: the sandbox's containers run (Slot).
	Bound UpdateKind = "bound"
	// Ready: the sandbox's daemon answers.
	Ready UpdateKind = "ready"
	// Exited: a container exited (Container, ExitCode, Reason, Message).
	Exited UpdateKind = "exited"
	// Failed: the bind failed (Reason, Message); Permanent when retrying the
	// same pod cannot help.
	Failed UpdateKind = "failed"
	// Lost: the slot of a bound pod vanished (its node agent restarted
	// without it, or stayed unreachable longer than LostAfter).
	Lost UpdateKind = "lost"
	// Moved: the node moved the pod's sandbox away (a drain; Moved says
	// where its running state went) and holds it no more: the pod is no
	// longer placed. Submitted again with Bind.Restore, it goes on where
	// it stopped, on another node.
	Moved UpdateKind = "moved"
)

// Update is one change of a pod's placement.
type Update struct {
	Kind UpdateKind
	UID  string
	// Node is the node agent the pod is placed on.
	Node string
	Slot runtime.Slot
	Time time.Time

	Container string
	ExitCode  int
	Reason    string
	Message   string
	Permanent bool
	// Moved: the checkpoint a Moved update left.
	Moved *runtime.MovedCheckpoint
}

// Pool places pods onto the slots of a set of node agents.
type Pool struct {
	cfg Config
	log *slog.Logger
	// wake nudges the dispatcher: a submission, a freed slot, a bind done.
	wake chan struct{}

	// mu guards everything below.
	mu     sync.Mutex
	nodes  map[string]*node
	queue  admission
	placed map[string]*placement // pod UID → where it went
	// held counts placements per job and heldNS per namespace: the
	// admission queue's fair shares. A paused pod's placement does not
	// count (placement.paused).
	held   map[jobKey]int
	heldNS map[string]int
	// queuedAt is when each queued pod was submitted (admission wait).
	queuedAt map[string]time.Time
	// changed is closed (and replaced) when a node agent's inventory
	// arrives or a node agent is removed: WaitSynced looks again.
	changed chan struct{}
	// closed is set when Run ends: no node agent is followed after it.
	closed bool

	// bindWork counts the binds Run started and the releases they left
	// behind; Run waits for them.
	bindWork sync.WaitGroup
}

// placement is a pod the pool put (or is putting) on a node.
type placement struct {
	req  Request
	node string
	// binding: the bind call has not returned yet.
	binding bool
	// seen: the node's inventory shows the pod (so its slot is no longer
	// counted as free through the reservation).
	seen bool
	// on is the node an unseen placement counts against, res what it
	// holds there.
	on  *node
	res runtime.Resources
	// paused: its node reports its sandbox paused; it does not count in
	// its job's or namespace's share.
	paused bool
}

// placeOnLocked records a placement (forgetting an earlier one of uid); until the node's inventory shows it,
// it holds a slot and its requests on n.
func (p *Pool) placeOnLocked(uid string, pl *placement, n *node) {
	p.unplaceLocked(uid)
	p.placed[uid] = pl
	p.held[keyOf(pl.req)]++
	p.heldNS[pl.req.Bind.Pod.Namespace]++
	if !pl.seen && n != nil {
		pl.on, pl.res = n, pl.req.Bind.Requests()
		n.unseen++
		n.unseenRes = n.unseenRes.Add(pl.res)
	}
}

// markSeenLocked: the node's inventory shows the pod now.
func (pl *placement) markSeenLocked() {
	if pl.seen {
		return
	}
	pl.seen = true
	if n := pl.on; n != nil {
		n.unseen--
		n.unseenRes = runtime.Resources{MilliCPU: n.unseenRes.MilliCPU - pl.res.MilliCPU, MemoryBytes: n.unseenRes.MemoryBytes - pl.res.MemoryBytes}
		pl.on = nil
	}
}

// unplaceLocked forgets a placement.
func (p *Pool) unplaceLocked(uid string) {
	if pl, ok := p.placed[uid]; ok {
		pl.markSeenLocked()
		delete(p.placed, uid)
		if !pl.paused {
			p.shareLocked(keyOf(pl.req), -1)
		}
	}
}

// shareLocked adds d to a job's (and its namespace's) held placements.
func (p *Pool) shareLocked(key jobKey, d int) {
	if p.held[key] += d; p.held[key] <= 0 {
		delete(p.held, key)
	}
	if p.heldNS[key.ns] += d; p.heldNS[key.ns] <= 0 {
		delete(p.heldNS, key.ns)
	}
}

// setPausedLocked records whether a placement's sandbox is paused, as its
// node reports it: a paused one leaves its job's fair share (the slot it
// keeps still counts against its node), and counts again once resumed.
func (p *Pool) setPausedLocked(pl *placement, paused bool) {
	if pl.paused == paused {
		return
	}
	pl.paused = paused
	if paused {
		p.shareLocked(keyOf(pl.req), -1)
	} else {
		p.shareLocked(keyOf(pl.req), 1)
	}
}

// New returns a pool with no nodes.
func New(cfg Config) (*Pool, error) {
	if cfg.OnUpdate == nil {
		return nil, fmt.Errorf("pool: OnUpdate is required: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.MaxQueued <= 0 {
		cfg.MaxQueued = 100_000
	}
	switch {
	case cfg.MaxQueuedPerNamespace <= 0:
		cfg.MaxQueuedPerNamespace = cfg.MaxQueued
	case cfg.MaxQueuedPerNamespace > cfg.MaxQueued:
		return nil, fmt.Errorf("pool: MaxQueuedPerNamespace %d is more than MaxQueued %d: lower it to at most MaxQueued (0: MaxQueued): %w",
			cfg.MaxQueuedPerNamespace, cfg.MaxQueued, errdefs.ErrInvalidArgument)
	}
	weights := make(map[string]int, len(cfg.NamespaceWeights))
	for ns, w := range cfg.NamespaceWeights {
		if w < 1 || w > maxWeight {
			return nil, fmt.Errorf("pool: namespace %q has weight %d: want 1 to %d (weights are relative; not listed: 1): %w", ns, w, maxWeight, errdefs.ErrInvalidArgument)
		}
		weights[ns] = w
	}
	cfg.NamespaceWeights = weights
	if cfg.BindsPerNode <= 0 {
		cfg.BindsPerNode = 16
	}
	if cfg.SnapshotsPerNode <= 0 {
		cfg.SnapshotsPerNode = 2
	}
	if cfg.BindTimeout <= 0 {
		cfg.BindTimeout = 2 * time.Minute
	}
	if cfg.LostAfter <= 0 {
		cfg.LostAfter = 2 * time.Minute
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	return &Pool{
		cfg: cfg, log: cfg.Logger.With("pool", cfg.Name),
		wake:    make(chan struct{}, 1),
		changed: make(chan struct{}),
		nodes:   map[string]*node{},
		queue: newAdmission(func(ns string) int {
			if w, ok := weights[ns]; ok {
				return w
			}
			return 1
		}),
		placed: map[string]*placement{}, queuedAt: map[string]time.Time{},
		held: map[jobKey]int{}, heldNS: map[string]int{},
	}, nil
}

// maxWeight bounds a namespace's weight, so held×weight cannot overflow.
const maxWeight = 1_000_000

// changedLocked wakes WaitSynced.
func (p *Pool) changedLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Pool) nudge() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// Submit queues a pod for placement. It fails with ErrAlreadyExists when
// the pod is queued or placed already, and with ErrResourceExhausted when
// the admission queue is full (MaxQueued) or holds as many pods of the
// pod's namespace as one namespace may queue (MaxQueuedPerNamespace); the
// caller retries later.
func (p *Pool) Submit(req Request) error {
	uid := req.Bind.Pod.UID
	p.mu.Lock()
	defer p.mu.Unlock()
	if _, ok := p.placed[uid]; ok || p.queue.has(uid) {
		return fmt.Errorf("submit %s: already queued or placed: %w", uid, errdefs.ErrAlreadyExists)
	}
	if p.queue.len() >= p.cfg.MaxQueued {
		return fmt.Errorf("submit %s: the admission queue of pool %s is full (%d pods): %w", uid, p.cfg.Name, p.queue.len(), errdefs.ErrResourceExhausted)
	}
	if ns := req.Bind.Pod.Namespace; p.queue.lenIn(ns) >= p.cfg.MaxQueuedPerNamespace {
		return fmt.Errorf("submit %s: namespace %s has %d pods in the admission queue of pool %s, the most one namespace may queue (MaxQueuedPerNamespace %d); submit again once some are placed or deleted: %w",
			uid, ns, p.queue.lenIn(ns), p.cfg.Name, p.cfg.MaxQueuedPerNamespace, errdefs.ErrResourceExhausted)
	}
	p.queue.push(req)
	p.queuedAt[uid] = p.cfg.Clock.Now()
	p.nudge()
	return nil
}

// Release takes a pod out of the queue, or stops its sandbox on the node it
// was placed on. Releasing an unknown pod is not an error.
func (p *Pool) Release(ctx context.Context, uid string, grace time.Duration) error {
	p.mu.Lock()
	if p.queue.remove(uid) {
		delete(p.queuedAt, uid)
		p.mu.Unlock()
		return nil
	}
	pl, ok := p.placed[uid]
	if !ok {
		p.mu.Unlock()
		return nil
	}
	n := p.nodes[pl.node]
	p.mu.Unlock()
	if n == nil {
		p.forget(uid)
		return nil
	}
	if err := n.rt.Release(ctx, uid, grace); err != nil {
		return fmt.Errorf("release %s on %s: %w", uid, pl.node, err)
	}
	p.forget(uid)
	return nil
}

// ReleaseOn stops a pod's sandbox on one node, whatever the pool thinks:
// for slots that hold pods the provider does not know (orphans).
func (p *Pool) ReleaseOn(ctx context.Context, nodeName, uid string, grace time.Duration) error {
	p.mu.Lock()
	n := p.nodes[nodeName]
	p.mu.Unlock()
	if n == nil {
		return fmt.Errorf("release %s: node agent %s: %w", uid, nodeName, errdefs.ErrNotFound)
	}
	return n.rt.Release(ctx, uid, grace)
}

func (p *Pool) forget(uid string) {
	p.mu.Lock()
	p.unplaceLocked(uid)
	p.mu.Unlock()
	p.nudge()
}

// Adopt records a pod found bound on a node (after a restart) as placed
// there, so it is neither placed again nor released as an orphan.
func (p *Pool) Adopt(req Request, nodeName string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.placeOnLocked(req.Bind.Pod.UID, &placement{req: req, node: nodeName, seen: true}, nil)
}

// Queued reports whether a pod waits in the admission queue, and its
// position (0 = next).
func (p *Pool) Queued(uid string) (int, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.queue.position(uid)
}

// Run places queued pods until ctx ends. When it returns, the pool follows
// no node agent and no bind it started runs.
func (p *Pool) Run(ctx context.Context) error {
	defer func() {
		p.mu.Lock()
		p.closed = true
		nodes := slices.Collect(maps.Values(p.nodes))
		p.mu.Unlock()
		for _, n := range nodes {
			n.stop()
		}
		p.bindWork.Wait()
	}()
	tick := p.cfg.Clock.NewTicker(time.Second)
	defer tick.Stop()
	for {
		p.dispatch(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-p.wake:
		case <-tick.C():
			p.checkLost()
		}
	}
}

// dispatch starts binds for queued pods while some node can take them.
func (p *Pool) dispatch(ctx context.Context) {
	p.mu.Lock()
	now := p.cfg.Clock.Now()
	var gone []Update
	p.queue.fairRound(func(ns string) int { return p.heldNS[ns] }, func(k jobKey) int { return p.held[k] }, func(req Request) bool {
		if f := req.Bind.Fork; f != nil && p.placed[f.PodUID] == nil {
			// A fork starts on its source's node: with its source gone,
			// it cannot start anywhere.
			delete(p.queuedAt, req.Bind.Pod.UID)
			gone = append(gone, Update{Kind: Failed, UID: req.Bind.Pod.UID, Time: now, Reason: runtime.ReasonStartFailed, Permanent: true,
				Message: fmt.Sprintf("the fork's source pod %s is not placed in pool %s (deleted, or never started)", f.PodUID, p.cfg.Name)})
			return true
		}
		n, how := p.placeLocked(req)
		if n == nil {
			return false
		}
		uid := req.Bind.Pod.UID
		metricPlacements.WithLabelValues(how).Inc()
		if at, ok := p.queuedAt[uid]; ok {
			metricAdmissionWait.Observe(now.Sub(at).Seconds())
			delete(p.queuedAt, uid)
		}
		p.placeOnLocked(uid, &placement{req: req, node: n.name, binding: true}, n)
		n.inflight++
		p.bindWork.Go(func() { p.bind(ctx, n, req) })
		return true
	})
	// Pods that still wait learn why, once.
	var queued []Update
	for _, req := range p.queue.takeFresh() {
		metricPlacements.WithLabelValues("waiting").Inc()
		queued = append(queued, Update{Kind: Queued, UID: req.Bind.Pod.UID, Time: p.cfg.Clock.Now(),
			Reason: podcontract.ReasonWaitingForSlot, Message: p.noFitMessageLocked(req)})
	}
	// Told without the pool's lock, as every update is: the receiver takes
	// its own lock, under which it calls the pool (the provider's
	// reconciler asks Unsynced while holding it).
	p.mu.Unlock()
	for _, u := range append(gone, queued...) {
		p.cfg.OnUpdate(u)
	}
}

// bind runs one bind on a node and reports how it went.
func (p *Pool) bind(ctx context.Context, n *node, req Request) {
	uid := req.Bind.Pod.UID
	start := p.cfg.Clock.Now()
	p.cfg.OnUpdate(Update{Kind: Placing, UID: uid, Node: n.name, Time: start})
	bctx, cancel := context.WithTimeout(ctx, p.cfg.BindTimeout)
	slot, err := n.rt.Bind(bctx, req.Bind)
	cancel()
	took := p.cfg.Clock.Now().Sub(start)
	metricBindSeconds.WithLabelValues(n.name, outcome(err)).Observe(took.Seconds())

	p.mu.Lock()
	n.inflight--
	n.binds.add(p.cfg.Clock.Now(), took, err == nil)
	pl := p.placed[uid]
	stillWanted := pl != nil && pl.node == n.name
	if err == nil {
		if stillWanted {
			pl.binding = false
		}
		p.mu.Unlock()
		p.nudge()
		if !stillWanted {
			// Released while binding: do not leave the sandbox behind.
			p.releaseLeftover(ctx, n, uid)
			return
		}
		p.cfg.OnUpdate(Update{Kind: Bound, UID: uid, Node: n.name, Slot: slot, Time: p.cfg.Clock.Now()})
		return
	}
	p.unplaceLocked(uid)
	retry := stillWanted && retryElsewhere(err)
	if retry {
		// Another node may take it; it keeps its place at the front.
		p.queue.pushFront(req)
		if errdefs.IsUnavailable(err) || errors.Is(err, context.DeadlineExceeded) {
			n.suspectLocked(p.cfg.Clock.Now(), err)
		}
	}
	p.mu.Unlock()
	p.nudge()
	stopping := errors.Is(err, context.Canceled) && ctx.Err() != nil
	if errors.Is(err, context.DeadlineExceeded) || errdefs.IsUnavailable(err) || stopping {
		// The node may have bound it after all: make sure it did not.
		p.bindWork.Go(func() { p.releaseLeftover(ctx, n, uid) })
	}
	if stopping {
		// The pool is stopping: the outcome is unknown, not a failure of
		// the pod; the next pool (after a restart) places it again.
		return
	}
	if retry {
		p.log.Info("bind failed, placing again", "pod", podRefKey(req.Bind.Pod), "uid", uid, "node", n.name, "err", err)
		return
	}
	if !stillWanted {
		return
	}
	reason, permanent := failureReason(err)
	p.cfg.OnUpdate(Update{Kind: Failed, UID: uid, Node: n.name, Time: p.cfg.Clock.Now(), Reason: reason, Message: err.Error(), Permanent: permanent})
}

// releaseLeftover releases a pod a bind may have left on n. It outlives
// ctx (Run's), so a pool that stops still cleans up, for at most
// BindTimeout.
func (p *Pool) releaseLeftover(ctx context.Context, n *node, uid string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.BindTimeout)
	defer cancel()
	_ = n.rt.Release(rctx, uid, 0)
}

// podRefKey is a pod's namespace/name, for logs.
func podRefKey(ref runtime.PodRef) string { return ref.Namespace + "/" + ref.Name }

func outcome(err error) string {
	if err == nil {
		return "ok"
	}
	r, _ := failureReason(err)
	return r
}

// retryElsewhere: the node could not take the pod for a reason of its own.
func retryElsewhere(err error) bool {
	return errdefs.IsResourceExhausted(err) || errdefs.IsUnavailable(err) ||
		errors.Is(err, context.DeadlineExceeded)
}

// failureReason maps a bind error to a Kubernetes-style reason.
func failureReason(err error) (reason string, permanent bool) {
	switch {
	case errdefs.IsDataLoss(err):
		// A moved sandbox's state is gone or cannot be restored.
		return podcontract.ReasonResumeFailed, true
	case errors.Is(err, runtime.ErrImagePull):
		return runtime.ReasonErrImagePull, false
	case errdefs.IsInvalidArgument(err):
		return runtime.ReasonInvalidSpec, true
	case errdefs.IsNotFound(err), errdefs.IsUnauthorized(err), errdefs.IsPermissionDenied(err):
		// For a bind, what is missing or refused is the image.
		return runtime.ReasonErrImagePull, false
	case errdefs.IsAlreadyExists(err):
		return "AlreadyBound", true
	default:
		return runtime.ReasonStartFailed, false
	}
}

// placeLocked picks the node for req, or nil when none can take it now, and
// says why it chose it: "hot" (a hot slot of the image), "image" (the image
// is on the node) or "cold". A fork (Bind.Fork) goes to its source's node
// or waits.
func (p *Pool) placeLocked(req Request) (*node, string) {
	want := req.Bind.Requests()
	image := ""
	if len(req.Bind.Containers) > 0 {
		image = imageKey(req.Bind.Containers[0].Image)
	}
	var best *node
	bestScore := -1.0
	for _, n := range p.sortedNodesLocked() {
		if !n.healthy || n.inflight >= p.cfg.BindsPerNode || n.inv.Draining != "" {
			continue
		}
		if f := req.Bind.Fork; f != nil && (p.placed[f.PodUID] == nil || p.placed[f.PodUID].node != n.name) {
			continue // a fork starts from its source's checkpoint, on its node
		}
		free := n.freeSlotsLocked()
		if free <= 0 || !n.fitsLocked(want) {
			continue
		}
		score := float64(free) / float64(max(1, n.inv.Capacity.Slots)) // spread
		switch {
		case n.hot[image] > 0:
			score += 4
		case n.hasImageLocked(image):
			score += 2
		}
		if score > bestScore {
			best, bestScore = n, score
		}
	}
	switch {
	case best == nil:
		return nil, ""
	case best.hot[image] > 0:
		return best, "hot"
	case best.hasImageLocked(image):
		return best, "image"
	}
	return best, "cold"
}

// noFitMessageLocked says why req waits.
func (p *Pool) noFitMessageLocked(req Request) string {
	healthy, slots := 0, 0
	for _, n := range p.nodes {
		if n.healthy {
			healthy++
			slots += n.inv.Capacity.Slots
		}
	}
	if healthy == 0 {
		return fmt.Sprintf("pool %s has no reachable node agent; the pod waits for a slot", p.cfg.Name)
	}
	return fmt.Sprintf("all %d slots of pool %s on %d nodes are in use or do not fit the pod's requests; the pod waits for a slot in the admission queue", slots, p.cfg.Name, healthy)
}

func (p *Pool) sortedNodesLocked() []*node {
	out := slices.Collect(maps.Values(p.nodes))
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out
}

// NodeView is one node agent as the pool sees it.
type NodeView struct {
	Name     string
	Healthy  bool
	Error    string
	Capacity runtime.Capacity
	// Allocated is what bound and binding pods hold.
	Allocated runtime.Resources
	Slots     map[runtime.SlotState]int
	Inflight  int
	Images    []string
	// Binds are the node's bind calls over the last BindWindow.
	Binds BindStats
	// Unseen are the sandboxes last seen bound on the node while its agent
	// does not answer: they may still run on the worker, unseen (released
	// when the agent returns; otherwise drain or uninstall it there).
	Unseen int
	// Draining says why the agent takes no binds (empty: it does).
	Draining string
}

// Nodes returns a view of every node agent, sorted by name.
func (p *Pool) Nodes() []NodeView {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []NodeView
	for _, n := range p.sortedNodesLocked() {
		v := NodeView{Name: n.name, Healthy: n.healthy, Capacity: n.inv.Capacity, Slots: n.inv.Count(), Inflight: n.inflight,
			Images: slices.Sorted(maps.Keys(n.images)), Binds: n.binds.stats(p.cfg.Clock.Now())}
		if n.err != nil {
			v.Error = n.err.Error()
		}
		for _, s := range n.slots {
			switch s.State {
			case runtime.StateBinding, runtime.StateBound, runtime.StateReleasing:
				v.Allocated = v.Allocated.Add(s.Resources)
			}
			if !n.healthy && s.State == runtime.StateBound && s.Pod != nil {
				v.Unseen++
			}
		}
		v.Draining = n.inv.Draining
		out = append(out, v)
	}
	return out
}

// Capacity sums the capacity of the healthy node agents.
func (p *Pool) Capacity() runtime.Capacity {
	var c runtime.Capacity
	for _, v := range p.Nodes() {
		if v.Healthy {
			c.Slots += v.Capacity.Slots
			c.Resources = c.Resources.Add(v.Capacity.Resources)
		}
	}
	return c
}

// NodeImages is one node's answer to an image request.
type NodeImages struct {
	Node   string
	Images []runtime.ImageStatus
	// Err: the node could not be asked, or keeps no image cache.
	Err error
}

// PrePull pins images on every node agent (see runtime.ImageCache) and
// returns each node's error, if any.
func (p *Pool) PrePull(ctx context.Context, images []string) []NodeImages {
	return p.eachImageCache(ctx, func(ic runtime.ImageCache, ctx context.Context) ([]runtime.ImageStatus, error) {
		return nil, ic.PrePull(ctx, images)
	})
}

// ImageStatuses asks every node agent for its images.
func (p *Pool) ImageStatuses(ctx context.Context) []NodeImages {
	return p.eachImageCache(ctx, runtime.ImageCache.ImageStatuses)
}

func (p *Pool) eachImageCache(ctx context.Context, op func(runtime.ImageCache, context.Context) ([]runtime.ImageStatus, error)) []NodeImages {
	p.mu.Lock()
	nodes := p.sortedNodesLocked()
	p.mu.Unlock()
	out := make([]NodeImages, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		out[i].Node = n.name
		ic, ok := n.rt.(runtime.ImageCache)
		if !ok {
			out[i].Err = fmt.Errorf("node agent %s keeps no image cache: %w", n.name, errdefs.ErrNotImplemented)
			continue
		}
		wg.Go(func() { out[i].Images, out[i].Err = op(ic, ctx) })
	}
	wg.Wait()
	return out
}

// QueueLen is how many pods wait for a slot.
func (p *Pool) QueueLen() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.queue.len()
}

// NamespaceShare is one namespace's part of the pool: its pods waiting in
// the admission queue and its placements (binding or bound pods).
type NamespaceShare struct {
	Namespace string
	Queued    int
	Held      int
	Weight    int
}

// Shares lists the namespaces with pods queued or placed, sorted by name.
func (p *Pool) Shares() []NamespaceShare {
	p.mu.Lock()
	defer p.mu.Unlock()
	byNS := map[string]*NamespaceShare{}
	share := func(ns string) *NamespaceShare {
		if s := byNS[ns]; s != nil {
			return s
		}
		s := &NamespaceShare{Namespace: ns, Weight: p.queue.weight(ns)}
		byNS[ns] = s
		return s
	}
	for ns, n := range p.queue.depths() {
		share(ns).Queued = n
	}
	for ns, n := range p.heldNS {
		share(ns).Held = n
	}
	out := make([]NamespaceShare, 0, len(byNS))
	for _, ns := range slices.Sorted(maps.Keys(byNS)) {
		out = append(out, *byNS[ns])
	}
	return out
}

// BoundSlot is a slot that holds a pod, as a node agent reports it.
type BoundSlot struct {
	Node string
	Slot runtime.Slot
}

// Slots lists the slots holding pods on every healthy node agent.
func (p *Pool) Slots() []BoundSlot {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []BoundSlot
	for _, n := range p.sortedNodesLocked() {
		if !n.synced {
			continue
		}
		for _, s := range n.slots {
			if s.Pod != nil {
				out = append(out, BoundSlot{Node: n.name, Slot: s.Clone()})
			}
		}
	}
	return out
}

// Placement says where a pod is placed, if anywhere.
func (p *Pool) Placement(uid string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pl, ok := p.placed[uid]
	if !ok {
		return "", false
	}
	return pl.node, true
}

// Stats asks the node agent holding a pod for its sandbox's resource use.
func (p *Pool) Stats(ctx context.Context, uid string) (runtime.Stats, error) {
	p.mu.Lock()
	pl, ok := p.placed[uid]
	var n *node
	if ok {
		n = p.nodes[pl.node]
	}
	p.mu.Unlock()
	if n == nil {
		return runtime.Stats{}, fmt.Errorf("stats %s: not placed on a reachable node agent: %w", uid, errdefs.ErrNotFound)
	}
	return n.rt.Stats(ctx, uid)
}

// Name is the pool's name.
func (p *Pool) Name() string { return p.cfg.Name }

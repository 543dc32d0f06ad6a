package fake

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"
	"k8s.io/utils/clock"

	"github.com/sandman-dev/sandman/internal/lifecycle"
	"github.com/sandman-dev/sandman/runtime"
)

var _ runtime.Runtime = (*Runtime)(nil)

// Config configures a fake node.
type Config struct {
	// Node is the node's name (required).
	Node string
	// Slots is the node's slot capacity (default 10).
	Slots int
	// Resources is what the node offers (default 1 CPU and 1 GiB per slot).
	Resources runtime.Resources
	// Images are the images the fake registry has; binding any other image
	// fails with ImageNotFound. Nil: every image exists.
	Images []string
	// BindLatency is how long a bind takes; ReadyLatency how long after it
	// the daemon answers; ReleaseLatency how long a release blocks;
	// RecycleLatency how long recycling takes in the background.
	BindLatency, ReadyLatency, ReleaseLatency, RecycleLatency time.Duration
	// PullLatency is how long a pre-pull takes.
	PullLatency time.Duration
	// FailBind, when set, is asked before every bind; an error fails it.
	FailBind func(runtime.BindRequest) error
	// SnapshotRegistry is where snapshots go: an image named without a
	// registry host is put under it (empty: snapshots are off, as on a
	// node without --snapshot-registry). SnapshotLatency is how long a
	// snapshot takes; FailSnapshot, when set, is asked before every
	// snapshot of a bound pod, and an error fails it.
	SnapshotRegistry string
	SnapshotLatency  time.Duration
	FailSnapshot     func(runtime.SnapshotRequest) error
	// IPBase is the first three octets of slot addresses (default "10.250.0").
	IPBase string
	// Clock tells the time and times the latencies (default
	// clock.RealClock).
	Clock clock.Clock
}

// Runtime is an in-memory node.
type Runtime struct {
	cfg Config
	hub *runtime.Hub
	// ctx ends at Close: the background work (readiness, recycling,
	// pulls) stops; wg counts it.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// mu guards slots, byPod, changed, closed and images, and the
	// additions to wg (none once closed); events are published under it.
	mu    sync.Mutex
	slots []*runtime.Slot
	byPod map[string]*runtime.Slot
	// changed is closed and replaced at every slot state change.
	changed chan struct{}
	// closed is set by Close.
	closed bool
	// images are pre-pulled or pinned images, by reference.
	images map[string]*runtime.ImageStatus
	// containers are the container names of bound pods, by pod UID.
	containers map[string][]string
	// snapshots are the snapshots taken, in order; pushed are their
	// images, which the fake registry has from then on.
	snapshots []runtime.SnapshotRequest
	pushed    map[string]bool
	// gvisor are the bound pods that run under gVisor (they can be
	// paused), by pod UID.
	gvisor map[string]bool
	// egress is what SetEgress set, by pod UID.
	egress map[string]runtime.Egress
	// restores are the moved sandboxes binds restored, in order; deleted
	// the checkpoints DeleteCheckpoint deleted.
	restores []runtime.MovedCheckpoint
	deleted  []string
}

// New returns a fake node with all its slots warm.
func New(cfg Config) (*Runtime, error) {
	if cfg.Node == "" {
		return nil, fmt.Errorf("fake runtime: node name is required: %w", errdefs.ErrInvalidArgument)
	}
	if cfg.Slots <= 0 {
		cfg.Slots = 10
	}
	if cfg.Resources == (runtime.Resources{}) {
		cfg.Resources = runtime.Resources{MilliCPU: 1000 * int64(cfg.Slots), MemoryBytes: int64(cfg.Slots) << 30}
	}
	if cfg.IPBase == "" {
		cfg.IPBase = "10.250.0"
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	r := &Runtime{cfg: cfg, hub: runtime.NewHub(4096), byPod: map[string]*runtime.Slot{}, images: map[string]*runtime.ImageStatus{},
		changed: make(chan struct{}), containers: map[string][]string{}, pushed: map[string]bool{}, gvisor: map[string]bool{}}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	now := cfg.Clock.Now()
	for i := range cfg.Slots {
		r.slots = append(r.slots, &runtime.Slot{
			ID: fmt.Sprintf("%s-%d", cfg.Node, i), State: runtime.StateWarm, Since: now,
			IP: cfg.IPBase + "." + strconv.Itoa(i%250+2),
		})
	}
	return r, nil
}

// Close ends all watches and the background work (slots becoming ready,
// recycling, pulls), and waits for it. Closing again does nothing more.
func (r *Runtime) Close() {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	r.cancel()
	r.wg.Wait()
	r.hub.Close()
}

// goLocked runs f in a goroutine Close waits for, unless the node is
// closed. The caller holds mu.
func (r *Runtime) goLocked(f func()) {
	if !r.closed {
		r.wg.Go(f)
	}
}

func (r *Runtime) setLocked(s *runtime.Slot, state runtime.SlotState) {
	s.State, s.Since = state, r.cfg.Clock.Now()
	r.hub.Publish(runtime.Event{Type: runtime.EventSlot, Time: s.Since, Slot: s.Clone()})
	close(r.changed)
	r.changed = make(chan struct{})
}

// Bind implements runtime.Runtime. A bind that restores a moved sandbox
// (Restore: of a gVisor pod of one container, as Validate wants) starts as
// any other and is recorded (Restores).
func (r *Runtime) Bind(ctx context.Context, req runtime.BindRequest) (runtime.Slot, error) {
	if err := req.Validate(); err != nil {
		// No slot was touched; watchers still learn why the pod failed.
		r.hub.Publish(runtime.InvalidSpecEvent(req, err, r.cfg.Clock.Now()))
		return runtime.Slot{}, err
	}
	r.mu.Lock()
	if _, ok := r.byPod[req.Pod.UID]; ok {
		r.mu.Unlock()
		return runtime.Slot{}, fmt.Errorf("bind %s: pod already bound on %s: %w", req.Pod.UID, r.cfg.Node, errdefs.ErrAlreadyExists)
	}
	if f := req.Fork; f != nil {
		// As the node agent: a fork starts from a running gVisor sandbox
		// of the same image on this node.
		src, ok := r.byPod[f.PodUID]
		switch {
		case !ok:
			r.mu.Unlock()
			return runtime.Slot{}, fmt.Errorf("bind %s: fork of %s: its source pod is not on node %s: %w", req.Pod.UID, f.PodUID, r.cfg.Node, errdefs.ErrFailedPrecondition)
		case src.State != runtime.StateBound || !r.gvisor[f.PodUID]:
			r.mu.Unlock()
			return runtime.Slot{}, fmt.Errorf("bind %s: fork of %s: only a running gVisor sandbox forks: %w", req.Pod.UID, f.PodUID, errdefs.ErrFailedPrecondition)
		case src.Image != req.Containers[0].Image:
			r.mu.Unlock()
			return runtime.Slot{}, fmt.Errorf("bind %s: fork of %s: the fork runs its source's image %s: %w", req.Pod.UID, f.PodUID, src.Image, errdefs.ErrInvalidArgument)
		}
	}
	var slot *runtime.Slot
	var used runtime.Resources
	for _, s := range r.slots {
		switch s.State {
		case runtime.StateWarm, runtime.StateHot:
			if slot == nil {
				slot = s
			}
		case runtime.StateBinding, runtime.StateBound, runtime.StateReleasing:
			used = used.Add(s.Resources)
		}
	}
	want := req.Requests()
	if slot == nil {
		r.mu.Unlock()
		return runtime.Slot{}, fmt.Errorf("bind %s: no warm slot on %s: %w", req.Pod.UID, r.cfg.Node, errdefs.ErrResourceExhausted)
	}
	if total := used.Add(want); total.MilliCPU > r.cfg.Resources.MilliCPU || total.MemoryBytes > r.cfg.Resources.MemoryBytes {
		r.mu.Unlock()
		return runtime.Slot{}, fmt.Errorf("bind %s: requests %+v do not fit on %s: %w", req.Pod.UID, want, r.cfg.Node, errdefs.ErrResourceExhausted)
	}
	pod := req.Pod
	slot.Pod, slot.Image, slot.Resources, slot.Ready = &pod, req.Containers[0].Image, want, false
	r.byPod[pod.UID] = slot
	r.containers[pod.UID] = nil
	r.gvisor[pod.UID] = req.GVisor()
	for _, c := range req.Containers {
		r.containers[pod.UID] = append(r.containers[pod.UID], c.Name)
	}
	r.setLocked(slot, runtime.StateBinding)
	r.mu.Unlock()

	err := r.bindWork(ctx, req)

	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		reason := runtime.ReasonStartFailed
		if errdefs.IsNotFound(err) {
			reason = runtime.ReasonImageNotFound
		}
		ev := runtime.Event{Type: runtime.EventBindFailed, Time: r.cfg.Clock.Now(), Slot: slot.Clone(), Reason: reason, Message: err.Error()}
		r.resetLocked(slot)
		r.hub.Publish(ev)
		r.setLocked(slot, runtime.StateWarm)
		return runtime.Slot{}, err
	}
	r.setLocked(slot, runtime.StateBound)
	if req.Restore != nil {
		r.restores = append(r.restores, *req.Restore)
	}
	out := slot.Clone()
	r.goLocked(func() { r.ready(pod.UID, slot) })
	return out, nil
}

func (r *Runtime) bindWork(ctx context.Context, req runtime.BindRequest) error {
	if r.cfg.FailBind != nil {
		if err := r.cfg.FailBind(req); err != nil {
			return err
		}
	}
	if r.cfg.Images != nil {
		r.mu.Lock()
		pushed := maps.Clone(r.pushed)
		r.mu.Unlock()
		for _, c := range req.Containers {
			if !slices.Contains(r.cfg.Images, c.Image) && !pushed[c.Image] {
				return fmt.Errorf("bind %s: image %s: not found in the registry: %w: %w", req.Pod.UID, c.Image, runtime.ErrImagePull, errdefs.ErrNotFound)
			}
		}
	}
	return r.sleep(ctx, r.cfg.BindLatency)
}

// ready marks the slot ready after ReadyLatency if it still holds the pod.
func (r *Runtime) ready(uid string, slot *runtime.Slot) {
	if r.sleep(r.ctx, r.cfg.ReadyLatency) != nil {
		return // closed
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if slot.State != runtime.StateBound || slot.Pod == nil || slot.Pod.UID != uid {
		return
	}
	slot.Ready = true
	r.hub.Publish(runtime.Event{Type: runtime.EventReady, Time: r.cfg.Clock.Now(), Slot: slot.Clone()})
}

func (r *Runtime) resetLocked(s *runtime.Slot) {
	if s.Pod != nil {
		delete(r.byPod, s.Pod.UID)
		delete(r.containers, s.Pod.UID)
		delete(r.gvisor, s.Pod.UID)
	}
	s.Pod, s.Image, s.Resources, s.Ready, s.Reason = nil, "", runtime.Resources{}, false, ""
}

// Release implements runtime.Runtime.
func (r *Runtime) Release(ctx context.Context, uid string, grace time.Duration) error {
	r.mu.Lock()
	var slot *runtime.Slot
	for {
		var ok bool
		slot, ok = r.byPod[uid]
		if !ok || slot.State == runtime.StateReleasing {
			r.mu.Unlock()
			return nil
		}
		if slot.State != runtime.StateBinding {
			break
		}
		// Let the bind finish first, as the real runtime would.
		changed := r.changed
		r.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
		r.mu.Lock()
	}
	r.setLocked(slot, runtime.StateReleasing)
	r.mu.Unlock()
	if err := r.sleep(ctx, r.cfg.ReleaseLatency); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.goLocked(func() {
		if r.sleep(r.ctx, r.cfg.RecycleLatency) != nil {
			return // closed
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		r.resetLocked(slot)
		r.setLocked(slot, runtime.StateWarm)
	})
	return nil
}

// Watch implements runtime.Runtime.
func (r *Runtime) Watch(ctx context.Context) (runtime.Inventory, <-chan runtime.Event, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return runtime.Inventory{}, nil, fmt.Errorf("fake runtime %s is closed: %w", r.cfg.Node, errdefs.ErrUnavailable)
	}
	return r.inventoryLocked(), r.hub.Subscribe(ctx), nil
}

// Inventory implements runtime.Runtime.
func (r *Runtime) Inventory(ctx context.Context) (runtime.Inventory, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.inventoryLocked(), nil
}

func (r *Runtime) inventoryLocked() runtime.Inventory {
	inv := runtime.Inventory{
		Node:        r.cfg.Node,
		Capacity:    runtime.Capacity{Slots: len(r.slots), Resources: r.cfg.Resources},
		Slots:       make([]runtime.Slot, 0, len(r.slots)),
		ReadyImages: r.readyImagesLocked(),
	}
	for _, s := range r.slots {
		inv.Slots = append(inv.Slots, s.Clone())
	}
	return inv
}

// Stats implements runtime.Runtime with plausible numbers.
func (r *Runtime) Stats(ctx context.Context, uid string) (runtime.Stats, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.byPod[uid]
	if !ok || s.State != runtime.StateBound {
		return runtime.Stats{}, fmt.Errorf("stats %s: no bound pod on %s: %w", uid, r.cfg.Node, errdefs.ErrNotFound)
	}
	return runtime.Stats{Pod: *s.Pod, Time: r.cfg.Clock.Now(), MemoryBytes: 4 << 20, MemoryLimitBytes: uint64(s.Resources.MemoryBytes), Pids: 1,
		DiskBytes: 1 << 20}, nil
}

// sleep waits d on the node's clock, or until ctx ends (its error). A
// latency of zero (the default) does not wait: a fake clock would hold it
// until its next step.
func (r *Runtime) sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	if !lifecycle.Sleep(ctx, r.cfg.Clock, d) {
		return ctx.Err()
	}
	return nil
}

var _ runtime.ImageCache = (*Runtime)(nil)

func (r *Runtime) readyImagesLocked() []string {
	out := slices.Clone(r.cfg.Images)
	for ref := range r.pushed {
		if !slices.Contains(out, ref) {
			out = append(out, ref)
		}
	}
	for ref, st := range r.images {
		if st.State == runtime.ImageReady && !slices.Contains(out, ref) {
			out = append(out, ref)
		}
	}
	slices.Sort(out)
	return out
}

// PrePull implements runtime.ImageCache: each image is ready after
// PullLatency, or failed when the fake registry does not have it.
func (r *Runtime) PrePull(ctx context.Context, images []string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return fmt.Errorf("fake runtime %s is closed: %w", r.cfg.Node, errdefs.ErrUnavailable)
	}
	for _, ref := range images {
		if st, ok := r.images[ref]; ok && st.State != runtime.ImageFailed {
			st.Pinned = true
			continue
		}
		st := &runtime.ImageStatus{Image: ref, State: runtime.ImagePulling, Pinned: true, BytesTotal: 1 << 20}
		r.images[ref] = st
		r.goLocked(func() {
			if r.sleep(r.ctx, r.cfg.PullLatency) != nil {
				return // closed
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.closed {
				return
			}
			ev := runtime.Event{Type: runtime.EventImageProgress, Time: r.cfg.Clock.Now(), Image: ref, BytesTotal: st.BytesTotal}
			if r.cfg.Images != nil && !slices.Contains(r.cfg.Images, ref) {
				st.State, st.ErrorKind = runtime.ImageFailed, "not_found"
				st.Error = "image " + ref + ": not found in the registry"
				ev.Reason, ev.Message = runtime.ReasonImageNotFound, st.Error
				r.hub.Publish(ev)
				return
			}
			st.State, st.BytesDone = runtime.ImageReady, st.BytesTotal
			ev.BytesDone, ev.Reason = st.BytesDone, "Pulled"
			r.hub.Publish(ev)
			r.hub.Publish(runtime.Event{Type: runtime.EventImages, Time: r.cfg.Clock.Now(), Images: r.readyImagesLocked()})
		})
	}
	return nil
}

// Unpin implements runtime.ImageCache.
func (r *Runtime) Unpin(ctx context.Context, images []string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, ref := range images {
		if st, ok := r.images[ref]; ok {
			st.Pinned = false
		}
	}
	return nil
}

// ImageStatuses implements runtime.ImageCache.
func (r *Runtime) ImageStatuses(ctx context.Context) ([]runtime.ImageStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, fmt.Errorf("fake runtime %s is closed: %w", r.cfg.Node, errdefs.ErrUnavailable)
	}
	out := make([]runtime.ImageStatus, 0, len(r.images))
	for _, st := range r.images {
		out = append(out, *st)
	}
	slices.SortFunc(out, func(a, b runtime.ImageStatus) int { return strings.Compare(a.Image, b.Image) })
	return out, nil
}

var _ runtime.Snapshotter = (*Runtime)(nil)

// Snapshot implements runtime.Snapshotter: after SnapshotLatency (with
// every phase reported), the image is ready on this node (in its ready
// images and image list) and binds there even when Images restricts what
// the fake registry has. Errors are those of the real
// runtime: NotFound for a pod not here, FailedPrecondition for one not
// bound or a node without SnapshotRegistry, InvalidArgument for a pod of
// several containers without Container, an unknown container, or an
// image in another registry; and whatever FailSnapshot returns.
func (r *Runtime) Snapshot(ctx context.Context, req runtime.SnapshotRequest, progress func(runtime.SnapshotProgress)) (runtime.SnapshotResult, error) {
	if progress == nil {
		progress = func(runtime.SnapshotProgress) {}
	}
	begin := r.cfg.Clock.Now()
	r.mu.Lock()
	s, ok := r.byPod[req.PodUID]
	names := r.containers[req.PodUID]
	var state runtime.SlotState
	var base string
	if ok {
		state, base = s.State, s.Image
	}
	r.mu.Unlock()
	switch {
	case !ok:
		return runtime.SnapshotResult{}, fmt.Errorf("snapshot: pod %s is not on node %s: %w", req.PodUID, r.cfg.Node, errdefs.ErrNotFound)
	case state != runtime.StateBound:
		return runtime.SnapshotResult{}, fmt.Errorf("snapshot: pod %s is %s on node %s, not bound: %w", req.PodUID, state, r.cfg.Node, errdefs.ErrFailedPrecondition)
	case r.cfg.SnapshotRegistry == "":
		return runtime.SnapshotResult{}, fmt.Errorf("snapshots are off on this node: sandman-node has no --snapshot-registry: %w", errdefs.ErrFailedPrecondition)
	case req.Container == "" && len(names) != 1, req.Container != "" && !slices.Contains(names, req.Container):
		return runtime.SnapshotResult{}, fmt.Errorf("snapshot: pod %s has containers %s: name one of them (container): %w",
			req.PodUID, strings.Join(names, ", "), errdefs.ErrInvalidArgument)
	}
	name := req.Image
	if first, _, hasHost := strings.Cut(name, "/"); !hasHost || !strings.ContainsAny(first, ".:") && first != "localhost" {
		name = r.cfg.SnapshotRegistry + "/" + name
	}
	if !strings.HasPrefix(name, r.cfg.SnapshotRegistry+"/") || name == r.cfg.SnapshotRegistry+"/" {
		return runtime.SnapshotResult{}, fmt.Errorf("snapshot image %q is not in this node's snapshot registry %s: %w", req.Image, r.cfg.SnapshotRegistry, errdefs.ErrInvalidArgument)
	}
	if r.cfg.FailSnapshot != nil {
		if err := r.cfg.FailSnapshot(req); err != nil {
			return runtime.SnapshotResult{}, err
		}
	}
	const layer = 1 << 20
	progress(runtime.SnapshotProgress{Phase: runtime.SnapshotFreeze})
	progress(runtime.SnapshotProgress{Phase: runtime.SnapshotDiff, BytesDone: 2 * layer})
	progress(runtime.SnapshotProgress{Phase: runtime.SnapshotCommit})
	if err := r.sleep(ctx, r.cfg.SnapshotLatency); err != nil {
		return runtime.SnapshotResult{}, err
	}
	progress(runtime.SnapshotProgress{Phase: runtime.SnapshotPush, BytesDone: layer, BytesTotal: layer})
	r.mu.Lock()
	r.snapshots = append(r.snapshots, req)
	n := len(r.snapshots)
	r.pushed[name] = true
	r.images[name] = &runtime.ImageStatus{Image: name, State: runtime.ImageReady, BytesDone: layer, BytesTotal: layer, SizeBytes: layer}
	r.hub.Publish(runtime.Event{Type: runtime.EventImages, Time: r.cfg.Clock.Now(), Images: r.readyImagesLocked()})
	r.mu.Unlock()
	progress(runtime.SnapshotProgress{Phase: runtime.SnapshotDone})
	return runtime.SnapshotResult{
		Image: name, Digest: fmt.Sprintf("sha256:%064x", n), BaseImage: base,
		Layer: fmt.Sprintf("sha256:%064x", n<<32), LayerBytes: layer, DiffBytes: 2 * layer,
		Frozen: time.Millisecond, Duration: r.cfg.Clock.Since(begin),
	}, nil
}

// Snapshots returns the snapshots the node took, in order.
func (r *Runtime) Snapshots() []runtime.SnapshotRequest {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.snapshots)
}

var _ runtime.Checkpointer = (*Runtime)(nil)

// Pause implements runtime.Checkpointer: a bound gVisor pod's slot becomes
// paused at once (its checkpoint as large as its memory request). Errors
// are the real runtime's: NotFound, FailedPrecondition for a pod not bound,
// of several containers, or under runc.
func (r *Runtime) Pause(ctx context.Context, uid string) (runtime.PauseResult, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.byPod[uid]
	switch {
	case !ok:
		return runtime.PauseResult{}, fmt.Errorf("pause %s: pod not on node %s: %w", uid, r.cfg.Node, errdefs.ErrNotFound)
	case s.State == runtime.StatePaused:
		return runtime.PauseResult{Bytes: s.Resources.MemoryBytes}, nil
	case s.State != runtime.StateBound:
		return runtime.PauseResult{}, fmt.Errorf("pause %s: the pod is %s: %w", uid, s.State, errdefs.ErrFailedPrecondition)
	case len(r.containers[uid]) != 1:
		return runtime.PauseResult{}, fmt.Errorf("pause %s: only a pod of one container can be paused: %w", uid, errdefs.ErrFailedPrecondition)
	case !r.gvisor[uid]:
		return runtime.PauseResult{}, fmt.Errorf("pause %s: the pod runs under runc: only gVisor sandboxes keep their processes and memory (CRIU is not available): %w", uid, errdefs.ErrFailedPrecondition)
	}
	s.Ready = false
	r.setLocked(s, runtime.StatePaused)
	return runtime.PauseResult{Bytes: s.Resources.MemoryBytes}, nil
}

// Resume implements runtime.Checkpointer: a paused pod's slot is bound
// again if its requests fit, and ready after ReadyLatency.
func (r *Runtime) Resume(ctx context.Context, uid string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.byPod[uid]
	switch {
	case !ok:
		return fmt.Errorf("resume %s: pod not on node %s: %w", uid, r.cfg.Node, errdefs.ErrNotFound)
	case s.State == runtime.StateBound:
		return nil
	case s.State != runtime.StatePaused:
		return fmt.Errorf("resume %s: the pod is %s, not paused: %w", uid, s.State, errdefs.ErrFailedPrecondition)
	}
	var used runtime.Resources
	for _, o := range r.slots {
		if o.State == runtime.StateBinding || o.State == runtime.StateBound || o.State == runtime.StateReleasing {
			used = used.Add(o.Resources)
		}
	}
	if total := used.Add(s.Resources); total.MilliCPU > r.cfg.Resources.MilliCPU || total.MemoryBytes > r.cfg.Resources.MemoryBytes {
		return fmt.Errorf("resume %s: requests %+v do not fit on %s: %w", uid, s.Resources, r.cfg.Node, errdefs.ErrResourceExhausted)
	}
	r.setLocked(s, runtime.StateBound)
	r.goLocked(func() { r.ready(uid, s) })
	return nil
}

var _ runtime.EgressSetter = (*Runtime)(nil)

// SetEgress implements runtime.EgressSetter: a bound or paused pod's
// egress is recorded (Egress reads it). Errors are the real runtime's.
func (r *Runtime) SetEgress(ctx context.Context, uid string, e runtime.Egress) error {
	if err := e.Validate(); err != nil {
		return fmt.Errorf("egress of %s: %w", uid, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.byPod[uid]
	switch {
	case !ok:
		return fmt.Errorf("egress of %s: pod not on node %s: %w", uid, r.cfg.Node, errdefs.ErrNotFound)
	case s.State != runtime.StateBound && s.State != runtime.StatePaused:
		return fmt.Errorf("egress of %s: the pod is %s: %w", uid, s.State, errdefs.ErrFailedPrecondition)
	}
	if r.egress == nil {
		r.egress = map[string]runtime.Egress{}
	}
	r.egress[uid] = e
	return nil
}

// Egress is the egress SetEgress last set for a pod, and whether it set any.
func (r *Runtime) Egress(uid string) (runtime.Egress, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e, ok := r.egress[uid]
	return e, ok
}

var _ runtime.CheckpointStore = (*Runtime)(nil)

// MoveOut moves a bound or paused gVisor pod off the node, as a drain of a
// node agent with a checkpoint repository does: a running sandbox is
// paused first, its exit is published with ReasonMoved and its checkpoint
// (ref, which names it by digest; Paused whether it was paused; From this
// node; Bytes its memory request, as Pause says), then its slot is
// released as Release does. Errors: NotFound for a
// pod not here, FailedPrecondition for one not bound or paused, of several
// containers or under runc, InvalidArgument for a ref without a digest.
func (r *Runtime) MoveOut(uid, ref string) (runtime.MovedCheckpoint, error) {
	if !strings.Contains(ref, "@sha256:") {
		return runtime.MovedCheckpoint{}, fmt.Errorf("move %s: checkpoint %q is not named by digest: %w", uid, ref, errdefs.ErrInvalidArgument)
	}
	r.mu.Lock()
	s, ok := r.byPod[uid]
	switch {
	case !ok:
		r.mu.Unlock()
		return runtime.MovedCheckpoint{}, fmt.Errorf("move %s: pod not on node %s: %w", uid, r.cfg.Node, errdefs.ErrNotFound)
	case s.State != runtime.StateBound && s.State != runtime.StatePaused:
		r.mu.Unlock()
		return runtime.MovedCheckpoint{}, fmt.Errorf("move %s: the pod is %s: %w", uid, s.State, errdefs.ErrFailedPrecondition)
	case len(r.containers[uid]) != 1:
		r.mu.Unlock()
		return runtime.MovedCheckpoint{}, fmt.Errorf("move %s: only a pod of one container moves: %w", uid, errdefs.ErrFailedPrecondition)
	case !r.gvisor[uid]:
		r.mu.Unlock()
		return runtime.MovedCheckpoint{}, fmt.Errorf("move %s: it runs under runc, whose processes cannot be saved (CRIU): %w", uid, errdefs.ErrFailedPrecondition)
	}
	moved := runtime.MovedCheckpoint{Ref: ref, Paused: s.State == runtime.StatePaused, From: r.cfg.Node, Bytes: s.Resources.MemoryBytes}
	if !moved.Paused {
		s.Ready = false
		r.setLocked(s, runtime.StatePaused)
	}
	m := moved
	r.hub.Publish(runtime.Event{Type: runtime.EventExit, Time: r.cfg.Clock.Now(), Slot: s.Clone(), Container: r.containers[uid][0],
		Reason: runtime.ReasonMoved, Moved: &m,
		Message: fmt.Sprintf("moved off node %s: its running state (%.1f MiB) waits in %s", r.cfg.Node, float64(moved.Bytes)/(1<<20), ref)})
	r.mu.Unlock()
	if err := r.Release(r.ctx, uid, 0); err != nil {
		return moved, fmt.Errorf("move %s: release its slot: %w", uid, err)
	}
	return moved, nil
}

var _ runtime.Mover = (*Runtime)(nil)

// Move implements runtime.Mover as MoveOut does, the checkpoint named
// fake.local/checkpoints/<namespace>/<pod>@<the digest of its UID>.
func (r *Runtime) Move(ctx context.Context, uid string) (runtime.MovedCheckpoint, error) {
	r.mu.Lock()
	s, ok := r.byPod[uid]
	var ref string
	if ok && s.Pod != nil {
		ref = "fake.local/checkpoints/" + s.Pod.Namespace + "/" + s.Pod.Name + "@" + digest.FromString(uid).String()
	}
	r.mu.Unlock()
	if !ok {
		return runtime.MovedCheckpoint{}, fmt.Errorf("move %s: pod not on node %s: %w", uid, r.cfg.Node, errdefs.ErrNotFound)
	}
	return r.MoveOut(uid, ref)
}

// Restores returns the moved sandboxes binds restored (BindRequest.Restore
// of the binds that succeeded), in order.
func (r *Runtime) Restores() []runtime.MovedCheckpoint {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.restores)
}

// DeleteCheckpoint implements runtime.CheckpointStore: the ref is recorded
// (DeletedCheckpoints). A ref that is not pod's (runtime.CheckMovedRef) is
// InvalidArgument.
func (r *Runtime) DeleteCheckpoint(ctx context.Context, pod runtime.PodRef, ref string) error {
	if err := runtime.CheckMovedRef(ref, pod); err != nil {
		return fmt.Errorf("delete checkpoint: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.deleted = append(r.deleted, ref)
	return nil
}

// DeletedCheckpoints returns the refs DeleteCheckpoint deleted, in order.
func (r *Runtime) DeletedCheckpoints() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.deleted)
}

package noderuntime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	gocni "github.com/containerd/go-cni"
	"golang.org/x/sync/errgroup"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/nodeimage"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/sandboxnet"
)

// Runtime keeps a worker's slots on containerd. Create it with New, run
// its background work (refilling warm slots, hot sandboxes, disk checks,
// images) with Run, and end it with Close (or Destroy).
type Runtime struct {
	cfg     Config
	client  *ctrd.Client
	cni     gocni.CNI
	hub     *runtime.Hub
	log     *slog.Logger
	images  *nodeimage.Manager
	health  *http.Client
	metrics *metrics
	// self are the node's addresses; deny is what no sandbox reaches
	// (sandboxnet.SpecialRanges, Config.EgressDeny, self).
	self, deny []netip.Prefix
	// routeSrc is the node's address towards a slot's (where its DNS goes).
	routeSrc func(netip.Addr) (netip.Addr, error)
	// cpus hands out exclusive cores (guarded by mu).
	cpus *cpuSets
	// kick wakes the refiller.
	kick chan struct{}

	// life ends at Close or Destroy: Run stops, and so do the watches of
	// bound sandboxes (readiness, exits). wg counts Run and every
	// goroutine the runtime starts outside it; Close waits for them.
	life    context.Context
	endLife context.CancelFunc
	wg      sync.WaitGroup
	// bgMu guards closed and the additions to wg (none once closed).
	bgMu   sync.Mutex
	closed bool
	// draining says why the node takes no binds (guarded by mu).
	draining string
	// releases counts Release calls tearing a sandbox down: Close lets
	// them finish (within its context) rather than leave one half done.
	releases sync.WaitGroup

	// mu guards slots, byPod, creating and groups; events are published
	// under it.
	mu       sync.Mutex
	slots    map[string]*slot
	byPod    map[string]*slot
	creating int
	// groups are the shim groups by name (Config.ShimGroupSize > 1).
	groups map[string]*shimGroup
	// heating counts hot sandboxes being started; mix is the recent binds
	// that decide which images are kept hot, hotPlan the targets last
	// planned from it (for the metrics).
	heating int
	mix     hotMix
	hotPlan map[string]int
	// hotFailures back off the hot starts of images whose last one failed.
	hotFailures map[string]hotFailure
}

// New checks cfg, loads the CNI config, re-adopts the sandboxes a previous
// agent left running and cleans what is half made.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("containerd runtime: %w", err)
	}
	cni, err := gocni.New(gocni.WithPluginConfDir(cfg.CNIConfDir), gocni.WithPluginDir([]string{cfg.CNIBinDir}),
		gocni.WithMinNetworkCount(2), gocni.WithInterfacePrefix("eth"))
	if err != nil {
		return nil, fmt.Errorf("containerd runtime: CNI: %w", err)
	}
	if err := cni.Load(gocni.WithLoNetwork, gocni.WithDefaultConf); err != nil {
		return nil, fmt.Errorf("containerd runtime: load CNI config from %s: %w", cfg.CNIConfDir, err)
	}
	r := &Runtime{
		cfg: cfg, client: cfg.Client, cni: cni, hub: runtime.NewHub(4096),
		log:    cfg.Logger.With("node", cfg.Node),
		health: &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}},
		kick:   make(chan struct{}, 1), metrics: newMetrics(cfg.Node),
		slots: map[string]*slot{}, byPod: map[string]*slot{}, groups: map[string]*shimGroup{},
		self: nodeAddrs(), routeSrc: routeSrc,
		mix: hotMix{window: cfg.HotMixWindow, halfLife: cfg.HotMixHalfLife},
	}
	r.deny = slices.Concat(sandboxnet.SpecialRanges, cfg.EgressDeny, r.self)
	r.life, r.endLife = context.WithCancel(r.nsCtx(context.Background()))
	r.images, err = nodeimage.New(ctx, nodeimage.Config{
		Client: cfg.Client, Namespace: cfg.Namespace, Node: cfg.Node, Snapshotter: cfg.Snapshotter,
		HostsDir: cfg.RegistryHostsDir, CacheBytes: cfg.ImageCacheBytes, PrePull: cfg.PrePull,
		PrePullConcurrency: cfg.PrePullConcurrency, SnapshotRepositories: cfg.SnapshotRepositories, InUse: r.imagesInUse,
		OnProgress: r.imageProgress, OnChange: r.imagesChanged, Logger: r.log, Clock: cfg.Clock,
	})
	if err != nil {
		return nil, fmt.Errorf("containerd runtime: %w", err)
	}
	if cfg.UserNamespaces != UserNamespacesOff {
		if err := r.checkUserNamespaces(r.nsCtx(ctx)); err != nil {
			return nil, fmt.Errorf("containerd runtime: %w", err)
		}
	}
	if r.cpus, err = newCPUSets(cfg.ReservedCPUs); err != nil {
		return nil, fmt.Errorf("containerd runtime: %w", err)
	}
	for _, d := range []string{r.slotsDir(), r.netnsDir()} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, err
		}
	}
	if err := r.makeHolderRoot(); err != nil {
		return nil, fmt.Errorf("containerd runtime: %w", err)
	}
	if err := r.prepareCpuset(); err != nil {
		return nil, fmt.Errorf("containerd runtime: gVisor: %w", err)
	}
	if err := r.writeRunscWrapper(); err != nil {
		return nil, fmt.Errorf("containerd runtime: gVisor: %w", err)
	}
	if err := r.recover(r.nsCtx(ctx)); err != nil {
		return nil, fmt.Errorf("containerd runtime: recover: %w", err)
	}
	return r, nil
}

func (r *Runtime) nsCtx(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, r.cfg.Namespace)
}

// goOwned runs f in a goroutine Close waits for; once the runtime is
// closed it does not run f and returns false.
func (r *Runtime) goOwned(f func()) bool {
	r.bgMu.Lock()
	defer r.bgMu.Unlock()
	if r.closed {
		return false
	}
	r.wg.Go(f)
	return true
}

// end stops the background work and waits for it (Close and Destroy).
func (r *Runtime) end() {
	r.bgMu.Lock()
	r.closed = true
	r.bgMu.Unlock()
	r.endLife()
	r.wg.Wait()
}

// sleep waits d on the runtime's clock; false when ctx ended first.
func (r *Runtime) sleep(ctx context.Context, d time.Duration) bool {
	t := r.cfg.Clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-ctx.Done():
		return false
	}
}

// Run keeps WarmSlots slots warm (and hot ones hot), checks disk use and
// runs the image manager until ctx ends or the runtime is closed. It
// returns once everything it started has stopped.
func (r *Runtime) Run(ctx context.Context) error {
	r.bgMu.Lock()
	if r.closed {
		r.bgMu.Unlock()
		return fmt.Errorf("containerd runtime of %s: closed: %w", r.cfg.Node, errdefs.ErrUnavailable)
	}
	r.wg.Add(1)
	r.bgMu.Unlock()
	defer r.wg.Done()
	ctx, cancel := context.WithCancel(r.nsCtx(ctx))
	defer context.AfterFunc(r.life, cancel)()
	// Refills, hot starts, the disk check and the image manager.
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // before the wait: what runs stops first
	wg.Go(func() { r.watchDisk(ctx) })
	wg.Go(func() { r.images.Run(ctx) })
	sem := make(chan struct{}, r.cfg.RefillConcurrency)
	tick := r.cfg.Clock.NewTicker(time.Second)
	defer tick.Stop()
	for {
		for {
			r.mu.Lock()
			n := r.needLocked()
			if n <= 0 {
				r.mu.Unlock()
				break
			}
			r.creating++
			r.mu.Unlock()
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				r.mu.Lock()
				r.creating--
				r.mu.Unlock()
				return nil
			}
			wg.Go(func() {
				defer func() { <-sem }()
				s, err := r.makeSlot(ctx)
				r.mu.Lock()
				r.creating--
				if err == nil {
					r.slots[s.ID] = s
					r.publishLocked(s)
				}
				r.mu.Unlock()
				if err != nil && ctx.Err() == nil {
					r.log.Error("make warm slot", "err", err)
					r.sleep(ctx, time.Second)
				}
				r.wake()
			})
		}
		r.heat(ctx, &wg)
		r.repairBroken(ctx, &wg)
		r.shedIdle(ctx, &wg)
		select {
		case <-ctx.Done():
			return nil
		case <-r.kick:
		case <-tick.C():
		}
	}
}

// repairBroken tries again, at most every repairEvery, to remove what
// broken slots could not (containerd was away, say): a slot whose
// leftovers are gone is warm again, so an outage does not cost capacity
// for good.
func (r *Runtime) repairBroken(ctx context.Context, wg *sync.WaitGroup) {
	now := r.cfg.Clock.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.slots {
		if s.State != runtime.StateBroken || s.repairing || now.Sub(s.Since) < repairEvery {
			continue
		}
		s.repairing = true
		ids := slices.Clone(s.leftovers)
		wg.Go(func() {
			var errs []error
			for _, id := range ids {
				errs = append(errs, r.removeLeftover(ctx, id))
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			s.repairing = false
			if err := errors.Join(errs...); err != nil {
				s.Reason = err.Error()
				r.setLocked(s, runtime.StateBroken) // Since moves: the next try waits
				return
			}
			r.log.Info("broken slot repaired", "slot", s.ID, "was", s.Reason)
			s.Reason, s.leftovers = "", nil
			r.setLocked(s, runtime.StateWarm)
			r.wake()
		})
	}
}

// removeLeftover removes container id and its snapshot, whichever exist.
func (r *Runtime) removeLeftover(ctx context.Context, id string) error {
	if err := r.removeContainer(ctx, id, 0); err != nil {
		return err
	}
	if err := r.client.SnapshotService(r.cfg.Snapshotter).Remove(ctx, id); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("remove snapshot %s: %w", id, err)
	}
	return nil
}

// repairEvery is how long a broken slot waits between repairs.
const repairEvery = 5 * time.Second

// needLocked is how many warm slots to make now.
func (r *Runtime) needLocked() int {
	warm := r.creating
	for _, s := range r.slots {
		if s.State == runtime.StateWarm && !s.heating {
			warm++
		}
	}
	if r.draining != "" {
		return 0
	}
	room := r.cfg.Slots - len(r.slots) - r.creating
	return min(r.cfg.WarmSlots-warm, room)
}

func (r *Runtime) wake() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}

func (r *Runtime) publishLocked(s *slot) {
	r.hub.Publish(runtime.Event{Type: runtime.EventSlot, Time: s.Since, Slot: s.Slot.Clone()})
}

func (r *Runtime) setLocked(s *slot, state runtime.SlotState) {
	s.State, s.Since = state, r.cfg.Clock.Now()
	r.publishLocked(s)
}

// Bind implements runtime.Runtime.
func (r *Runtime) Bind(ctx context.Context, req runtime.BindRequest) (runtime.Slot, error) {
	err := req.Validate()
	if err == nil {
		err = r.checkHandler(req)
	}
	if err == nil {
		_, err = r.userNS(req)
	}
	if err != nil {
		// No slot was touched; watchers still learn why the pod failed.
		r.hub.Publish(runtime.InvalidSpecEvent(req, err, r.cfg.Clock.Now()))
		return runtime.Slot{}, err
	}
	ctx = r.nsCtx(ctx)
	begin := time.Now()
	if err := r.authorizeImages(ctx, req); err != nil {
		reason := bindFailureReason(err)
		r.metrics.failures.WithLabelValues(reason).Inc()
		r.log.Warn("bind refused", "pod", req.Pod.Namespace+"/"+req.Pod.Name, "reason", reason, "err", err)
		pod := req.Pod
		r.hub.Publish(runtime.Event{Type: runtime.EventBindFailed, Time: r.cfg.Clock.Now(),
			Slot: runtime.Slot{Pod: &pod, State: runtime.StateWarm}, Reason: reason, Message: err.Error()})
		return runtime.Slot{}, err
	}
	s, hot, err := r.reserve(ctx, req)
	if err != nil {
		if errdefs.IsResourceExhausted(err) {
			r.metrics.failures.WithLabelValues("NoCapacity").Inc()
		}
		return runtime.Slot{}, err
	}
	r.metrics.observePhase("reserve", begin)
	if err := r.start(ctx, s, req); err != nil {
		reason := bindFailureReason(err)
		r.metrics.failures.WithLabelValues(reason).Inc()
		r.log.Warn("bind failed", "pod", req.Pod.Namespace+"/"+req.Pod.Name, "slot", s.ID, "reason", reason, "err", err)
		cleanupErr := r.removeContainers(context.WithoutCancel(ctx), s, 0)
		r.forgetNames(s)
		var ids []string
		for _, c := range req.Containers {
			ids = append(ids, s.ID+"-"+c.Name)
		}
		if cleanupErr == nil {
			// Snapshots made for containers that were never created.
			for _, id := range ids {
				cleanupErr = errors.Join(cleanupErr, r.removeLeftover(context.WithoutCancel(ctx), id))
			}
		}
		r.mu.Lock()
		freed := false
		for _, c := range req.Containers {
			// Cores given to a container that was never created.
			freed = r.cpus.releaseLocked(s.ID+"-"+c.Name) || freed
		}
		r.mu.Unlock()
		if freed {
			r.rebalanceCPUs()
		}
		r.mu.Lock()
		r.hub.Publish(runtime.Event{Type: runtime.EventBindFailed, Time: r.cfg.Clock.Now(), Slot: s.Slot.Clone(), Reason: reason, Message: err.Error()})
		delete(r.byPod, req.Pod.UID)
		// The assignment this bind kept for its daemons: left behind, the
		// slot's next pod would be handed this one's tokens (a hot sandbox
		// refuses them, and that pod never becomes Ready).
		clearAssignment(s.dir)
		s.Pod, s.Image, s.Resources, s.Ready, s.containers, s.assignToken = nil, "", runtime.Resources{}, false, nil, ""
		s.diskLimits, s.evicted, s.earlyExits = nil, "", nil
		if cleanupErr != nil {
			// The hot sandbox this bind took over, if it was not removed.
			s.Reason, s.leftovers = cleanupErr.Error(), append(ids, s.ID+hotSuffix)
			r.setLocked(s, runtime.StateBroken)
		} else {
			r.setLocked(s, runtime.StateWarm)
		}
		r.mu.Unlock()
		return runtime.Slot{}, err
	}
	r.metrics.observePhase("total", begin)
	if hot {
		r.metrics.binds.WithLabelValues("hot").Inc()
	} else {
		r.metrics.binds.WithLabelValues("generic").Inc()
	}
	for _, c := range req.Containers {
		if c.ExclusiveCPUs > 0 {
			r.rebalanceCPUs() // the new exclusive cores leave the shared pool
			break
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.setLocked(s, runtime.StateBound)
	for _, ev := range s.earlyExits {
		ev.Slot = s.Slot.Clone()
		r.hub.Publish(ev)
	}
	s.earlyExits = nil
	// Refill after the bind, not during it: on a small node the two would
	// share the CPU.
	r.wake()
	return s.Slot.Clone(), nil
}

// bindFailureReason is the Kubernetes-style reason of a failed bind.
func bindFailureReason(err error) string {
	switch {
	case errors.Is(err, runtime.ErrImagePull) && errdefs.IsNotFound(err):
		return runtime.ReasonImageNotFound
	case errors.Is(err, runtime.ErrImagePull):
		return runtime.ReasonErrImagePull
	case errdefs.IsInvalidArgument(err):
		return runtime.ReasonInvalidSpec
	}
	return runtime.ReasonStartFailed
}

// reserve takes a slot for the pod and marks it binding: a hot slot of its
// image if it may use one (hot: true), else the warm slot waiting longest,
// else a new one when the node has room, else an idle hot slot of another
// image, whose sandbox the bind removes first.
func (r *Runtime) reserve(ctx context.Context, req runtime.BindRequest) (_ *slot, hot bool, _ error) {
	want := req.Requests()
	pod := req.Pod
	r.mu.Lock()
	if _, ok := r.byPod[pod.UID]; ok {
		r.mu.Unlock()
		return nil, false, fmt.Errorf("bind %s: pod already bound on %s: %w", pod.UID, r.cfg.Node, errdefs.ErrAlreadyExists)
	}
	if r.draining != "" {
		r.mu.Unlock()
		return nil, false, fmt.Errorf("bind %s: %s: %w", pod.UID, r.draining, errdefs.ErrUnavailable)
	}
	var used runtime.Resources
	var warm, hotSlot, other *slot
	// A hot sandbox runs as any sandbox of its image does: a pod that sets
	// its user or groups or narrows what it may do (read-only root, dropped
	// capabilities, its own seccomp profile, runAsNonRoot, checked against
	// the user when the container is made) takes the generic path.
	// It also runs in a user namespace or not, as the node's default was
	// when it started: it serves only pods that want the same.
	// And it runs under runc: a gVisor pod takes a warm slot.
	hotOK := len(req.Containers) == 1 && req.Containers[0].DefaultSecurity() && req.Containers[0].ExclusiveCPUs == 0 && !req.GVisor()
	wantNS, _ := r.userNS(req) // Bind refused the error
	exclusive := 0
	for _, c := range req.Containers {
		exclusive += c.ExclusiveCPUs
	}
	if exclusive > len(r.cpus.all)-len(r.cpus.reserved)-len(r.cpus.owner) {
		r.mu.Unlock()
		return nil, false, fmt.Errorf("bind %s: %d exclusive CPUs asked, %d free on %s: %w", pod.UID, exclusive,
			len(r.cpus.all)-len(r.cpus.reserved)-len(r.cpus.owner), r.cfg.Node, errdefs.ErrResourceExhausted)
	}
	for _, s := range r.slots {
		switch s.State {
		case runtime.StateHot:
			if hotOK && hotSlot == nil && s.Image == req.Containers[0].Image && s.userNS == wantNS {
				hotSlot = s
			} else if other == nil || s.Since.Before(other.Since) {
				other = s
			}
		case runtime.StateWarm:
			if !s.heating && (warm == nil || s.Since.Before(warm.Since)) {
				warm = s
			}
		case runtime.StateBinding, runtime.StateBound, runtime.StateReleasing:
			used = used.Add(s.Resources)
		}
	}
	if total := used.Add(want); total.MilliCPU > r.cfg.Resources.MilliCPU || total.MemoryBytes > r.cfg.Resources.MemoryBytes {
		r.mu.Unlock()
		return nil, false, fmt.Errorf("bind %s: requests of %dm CPU and %d bytes do not fit on %s: %w", pod.UID, want.MilliCPU, want.MemoryBytes, r.cfg.Node, errdefs.ErrResourceExhausted)
	}
	// The mix counts the binds a hot sandbox could have served: a pod
	// that may not use one would keep sandboxes hot for nothing.
	if r.cfg.HotSlots > 0 && hotOK && wantNS == (r.cfg.UserNamespaces != UserNamespacesOff) {
		r.mix.add(req.Containers[0].Image, r.cfg.Clock.Now())
		if hotSlot == nil {
			r.metrics.hotMisses.Inc()
		}
	}
	switch {
	case hotSlot != nil:
		warm = hotSlot
	case warm == nil && len(r.slots)+r.creating < r.cfg.Slots:
		// Make one now, outside the lock.
		r.creating++
		r.mu.Unlock()
		s, err := r.makeSlot(ctx)
		r.mu.Lock()
		r.creating--
		if err != nil {
			r.mu.Unlock()
			return nil, false, fmt.Errorf("bind %s: %w", pod.UID, err)
		}
		r.slots[s.ID] = s
		warm = s
	case warm == nil && other != nil:
		// Every slot is taken, but one waits hot for another image: this
		// bind removes that sandbox (start, before its own containers)
		// rather than fail while the node has an idle slot.
		warm = other
		warm.stale, warm.containers = warm.containers, nil
		r.metrics.hotTakeovers.Inc()
	case warm == nil:
		r.mu.Unlock()
		return nil, false, fmt.Errorf("bind %s: all %d slots of %s are in use: %w", pod.UID, r.cfg.Slots, r.cfg.Node, errdefs.ErrResourceExhausted)
	}
	if warm != hotSlot {
		warm.containers, warm.assignToken = nil, ""
	}
	warm.Pod, warm.Image, warm.Resources, warm.Ready, warm.Reason = &pod, req.Containers[0].Image, want, false, ""
	r.byPod[pod.UID] = warm
	r.setLocked(warm, runtime.StateBinding)
	r.mu.Unlock()
	return warm, warm == hotSlot, nil
}

// start ensures the images and creates and starts the pod's containers.
func (r *Runtime) start(ctx context.Context, s *slot, req runtime.BindRequest) error {
	r.mu.Lock()
	token := s.assignToken
	r.mu.Unlock()
	if token != "" {
		// Checked before the slot was taken; asked again (usually an
		// answer kept in memory) in case the image was pulled in between.
		if err := r.authorizeImages(ctx, req); err != nil {
			return err
		}
		return r.assignHot(ctx, s, req, token)
	}
	r.mu.Lock()
	stale := s.stale
	s.stale = nil
	r.mu.Unlock()
	for _, id := range stale {
		// The idle hot sandbox of another image reserve took this slot from.
		if err := r.removeContainer(context.WithoutCancel(ctx), id, 0); err != nil {
			// Bind's cleanup tries again, and leaves the slot broken
			// rather than warm with the sandbox still in it.
			r.mu.Lock()
			s.containers = stale
			r.mu.Unlock()
			return fmt.Errorf("bind %s: remove the hot sandbox waiting in slot %s: %w", req.Pod.UID, s.ID, err)
		}
	}
	t := time.Now()
	images := make([]ctrd.Image, len(req.Containers))
	for i, c := range req.Containers {
		img, err := r.ensureImage(ctx, c.Image, req.PullSecrets)
		if err != nil {
			return fmt.Errorf("bind %s: %w", req.Pod.UID, err)
		}
		images[i] = img
	}
	r.metrics.observePhase("image", t)
	if err := r.bindFirewall(s, &req); err != nil {
		return err
	}
	if err := r.shape(s, &req); err != nil {
		return err
	}
	a := newAssignment(req)
	if err := a.save(s.dir); err != nil {
		return fmt.Errorf("bind %s: %w", req.Pod.UID, err)
	}
	for i, c := range req.Containers {
		id := s.ID + "-" + c.Name
		spec, err := r.specOpts(s, req, i, images[i], a.hash(), false)
		if err != nil {
			return err
		}
		labels := map[string]string{
			LabelNode: r.cfg.Node, LabelSlot: s.ID, LabelPodUID: req.Pod.UID, LabelPodNamespace: req.Pod.Namespace,
			LabelPodName: req.Pod.Name, LabelVirtualNode: req.VirtualNode, LabelContainer: c.Name,
			LabelIndex: strconv.Itoa(i), LabelImage: c.Image, LabelRequests: formatRequests(req.Requests()),
		}
		maps.Copy(labels, req.Labels)
		r.mu.Lock()
		if cpus := r.cpus.ownedLocked(id); len(cpus) > 0 {
			labels[LabelExclusiveCPUs] = formatCPUList(cpus)
		}
		r.mu.Unlock()
		t = time.Now()
		create := func() (ctrd.Container, error) {
			return r.client.NewContainer(ctx, id, r.containerOpts(id, images[i], spec, labels)...)
		}
		container, err := create()
		if errdefs.IsAlreadyExists(err) {
			// What an interrupted bind of this slot left (containerd went
			// away mid-bind): remove it and try once more.
			if rerr := r.removeLeftover(ctx, id); rerr != nil {
				err = errors.Join(err, rerr)
			} else {
				container, err = create()
			}
		}
		if err != nil {
			// The snapshot is made before the spec: a spec that fails leaves
			// it, and the slot's next bind would meet it.
			if rerr := r.client.SnapshotService(r.cfg.Snapshotter).Remove(context.WithoutCancel(ctx), id); rerr != nil && !errdefs.IsNotFound(rerr) {
				err = errors.Join(err, fmt.Errorf("remove its snapshot: %w", rerr))
			}
			return fmt.Errorf("bind %s: create container %s: %w", req.Pod.UID, c.Name, err)
		}
		r.mu.Lock()
		s.containers = append(s.containers, id)
		r.setDiskLimitLocked(s, id, c.DiskBytes)
		r.mu.Unlock()
		r.metrics.observePhase("create", t)
		t = time.Now()
		if err := r.startTask(ctx, s, container, c.Name); err != nil {
			return fmt.Errorf("bind %s: start container %s: %w", req.Pod.UID, c.Name, err)
		}
		r.metrics.observePhase("start", t)
	}
	r.watchReady(s, req.Pod.UID, a)
	return nil
}

// taskOpTimeout bounds a task's creation and start, which a bind's caller
// cannot cut short (startTask).
const taskOpTimeout = 2 * time.Minute

// startTask starts a container's task and watches for its exit.
//
// The caller's context does not cut the task's creation or start short:
// containerd finishes creating a task whose client stopped waiting, after
// the failed bind's cleanup looked for it and found none, and that orphan
// (its daemon listening on the slot's port, in the slot's network
// namespace) would keep every later pod of the slot from becoming Ready
// (seen when sandman-vk failed over mid-burst). The bind fails after the
// start instead, if its context ended, and its cleanup finds the task.
func (r *Runtime) startTask(reqCtx context.Context, s *slot, container ctrd.Container, name string) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(reqCtx), taskOpTimeout)
	defer cancel()
	if r.grouped() {
		r.mu.Lock()
		group := s.group
		r.mu.Unlock()
		// Usually running since the slot was made; one that exited is
		// started again. Without it the task still starts (newTask retries
		// a shim on its way out).
		if err := r.ensureHolder(ctx, group); err != nil {
			r.log.Warn("shim group without its holder", "slot", s.ID, "group", group, "err", err)
		}
	}
	task, err := r.newTask(ctx, container)
	if err != nil {
		return err
	}
	// The exit watch outlives the bind's request: its context must not end
	// with it (a wait broken that way is taken for a containerd restart),
	// only with the runtime.
	exit, err := task.Wait(r.life)
	if err != nil {
		_, _ = task.Delete(context.WithoutCancel(ctx), ctrd.WithProcessKill)
		return err
	}
	if err := task.Start(ctx); err != nil {
		_, _ = task.Delete(context.WithoutCancel(ctx), ctrd.WithProcessKill)
		return err
	}
	r.goOwned(func() { r.watchExit(s, container.ID(), name, exit) })
	// The container is recorded in the slot (s.containers): a bind that
	// fails now removes its task with it.
	return reqCtx.Err()
}

// watchExit reports a container's exit while its pod is bound (or cools a
// hot slot whose waiting sandbox exited). A wait that breaks because
// containerd restarted is not an exit: the wait is re-established.
func (r *Runtime) watchExit(s *slot, id, name string, exit <-chan ctrd.ExitStatus) {
	var st ctrd.ExitStatus
	for {
		var ok bool
		if st, ok = <-exit; !ok {
			return
		}
		if st.Error() == nil {
			break
		}
		if r.life.Err() != nil {
			return // the runtime closed: the next agent watches the sandbox
		}
		next, lost, released := r.rewait(s, id)
		if released {
			return
		}
		if lost {
			st = *ctrd.NewExitStatus(255, r.cfg.Clock.Now(), nil)
			break
		}
		exit = next
	}
	code := int(st.ExitCode())
	reason := runtime.ReasonCompleted
	if code != 0 {
		reason = runtime.ReasonError
		if r.oomKilled(id) {
			reason = runtime.ReasonOOMKilled
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	message := ""
	if s.evicted != "" {
		reason, message = runtime.ReasonEvicted, s.evicted
	}
	if s.State == runtime.StateHot && slices.Contains(s.containers, id) {
		r.log.Warn("hot sandbox exited while waiting", "slot", s.ID, "image", s.Image, "code", code)
		s.State = runtime.StateBinding // nobody may take it while it is cleaned
		r.goOwned(func() { r.coolDown(s) })
		return
	}
	if !slices.Contains(s.containers, id) {
		return // released
	}
	ev := runtime.Event{Type: runtime.EventExit, Time: st.ExitTime(), Slot: s.Slot.Clone(),
		Container: name, ExitCode: code, Reason: reason, Message: message}
	switch s.State {
	case runtime.StateBinding:
		// A main command that ends at once can end before its bind
		// returns: Bind publishes the exit once the slot is bound (a bind
		// that fails drops it).
		s.earlyExits = append(s.earlyExits, ev)
	case runtime.StateBound:
		r.hub.Publish(ev)
	}
}

// rewait re-establishes the exit watch of container id after its wait
// broke (containerd restarting), retrying with backoff. lost: the task is
// gone; released: the slot no longer holds the container, or the runtime
// closed.
func (r *Runtime) rewait(s *slot, id string) (exit <-chan ctrd.ExitStatus, lost, released bool) {
	ctx := r.life
	for backoff := 100 * time.Millisecond; ; backoff = min(2*backoff, 5*time.Second) {
		r.mu.Lock()
		held := slices.Contains(s.containers, id)
		r.mu.Unlock()
		if !held || !r.sleep(ctx, backoff) {
			return nil, false, true
		}
		container, err := r.client.LoadContainer(ctx, id)
		if errdefs.IsNotFound(err) {
			return nil, true, false
		}
		var task ctrd.Task
		if err == nil {
			task, err = container.Task(ctx, nil)
			if errdefs.IsNotFound(err) {
				return nil, true, false
			}
		}
		if err == nil {
			if exit, err = task.Wait(ctx); err == nil {
				r.log.Info("re-established an exit watch after losing containerd", "slot", s.ID, "container", id)
				return exit, false, false
			}
		}
		r.log.Debug("exit watch: containerd not back yet", "container", id, "err", err)
	}
}

// oomKilled reads the container's memory cgroup OOM-kill count (v1).
func (r *Runtime) oomKilled(id string) bool {
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory", r.cfg.Namespace, id, "memory.oom_control"))
	if err != nil {
		return false
	}
	return slices.ContainsFunc(strings.Split(string(b), "\n"), func(l string) bool {
		return strings.HasPrefix(l, "oom_kill ") && l != "oom_kill 0"
	})
}

// watchReady marks the slot ready once every daemon took the pod's
// assignment a, or, with none (a hot sandbox, assigned by its bind, or one
// assigned before an agent restart), once the first daemon answers.
func (r *Runtime) watchReady(s *slot, uid string, a *assignment) {
	ctx, cancel := context.WithTimeout(r.life, r.cfg.ReadyTimeout)
	r.mu.Lock()
	s.stopReady = cancel
	url := "http://" + s.IP + ":" + strconv.Itoa(api.Port) + "/v1/health"
	ip, dir := s.IP, s.dir
	key := ""
	if s.Pod != nil {
		key = s.Pod.Namespace + "/" + s.Pod.Name
	}
	r.mu.Unlock()
	started := r.goOwned(func() {
		defer cancel()
		for {
			if a != nil {
				if r.assign(ctx, ip, dir, a) == nil {
					break
				}
			} else {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				if resp, err := r.health.Do(req); err == nil {
					resp.Body.Close()
					if resp.StatusCode == http.StatusOK {
						break
					}
				}
			}
			if !r.sleep(ctx, 5*time.Millisecond) {
				if errors.Is(ctx.Err(), context.DeadlineExceeded) {
					r.log.Warn("sandbox daemon did not answer", "slot", s.ID, "pod", key, "uid", uid, "timeout", r.cfg.ReadyTimeout)
				}
				return
			}
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if s.Pod == nil || s.Pod.UID != uid || s.State == runtime.StateReleasing {
			return
		}
		s.Ready = true
		r.hub.Publish(runtime.Event{Type: runtime.EventReady, Time: r.cfg.Clock.Now(), Slot: s.Slot.Clone()})
	})
	if !started {
		cancel()
	}
}

// Release implements runtime.Runtime.
func (r *Runtime) Release(ctx context.Context, uid string, grace time.Duration) error {
	ctx = r.nsCtx(ctx)
	for {
		r.mu.Lock()
		s, ok := r.byPod[uid]
		if !ok || s.State == runtime.StateReleasing {
			r.mu.Unlock()
			return nil
		}
		// A bind finishes or fails first; a snapshot that reads the
		// sandbox's filesystem (frozen) finishes that part first.
		if s.State != runtime.StateBinding && s.snapshots == 0 {
			if s.stopReady != nil {
				s.stopReady()
			}
			s.Ready = false
			r.setLocked(s, runtime.StateReleasing)
			r.releases.Add(1)
			r.mu.Unlock()
			break
		}
		r.mu.Unlock()
		if !r.sleep(ctx, 10*time.Millisecond) {
			return ctx.Err()
		}
	}
	defer r.releases.Done()
	r.mu.Lock()
	s := r.byPod[uid]
	ids := slices.Clone(s.containers)
	r.mu.Unlock()
	begin := time.Now()
	err := r.removeContainers(ctx, s, grace)
	r.forgetNames(s)
	// Back to the base firewall now, so the next bind only adds to it (a
	// reset waits for a kernel grace period: here, not on a bind).
	clean := false
	if err == nil {
		var ferr error
		if clean, ferr = r.firewall(s.netns.GetPath(), s.IP, nil, false); ferr != nil {
			r.log.Warn("reset the firewall of a released slot", "slot", s.ID, "err", ferr)
		}
	}
	r.metrics.releaseSeconds.Observe(time.Since(begin).Seconds())
	r.mu.Lock()
	defer r.mu.Unlock()
	s.fwClean = clean
	delete(r.byPod, uid)
	s.Pod, s.Image, s.Resources, s.containers, s.assignToken = nil, "", runtime.Resources{}, nil, ""
	s.diskLimits, s.evicted, s.fwReq = nil, "", nil
	clearAssignment(s.dir)
	if err != nil {
		s.Reason, s.leftovers = err.Error(), ids
		r.setLocked(s, runtime.StateBroken)
		return fmt.Errorf("release %s: %w", uid, err)
	}
	r.metrics.recycles.Inc()
	r.setLocked(s, runtime.StateWarm)
	r.wake()
	return nil
}

// removeContainers stops the slot's containers (TERM, grace, KILL) and
// deletes them with their snapshots.
func (r *Runtime) removeContainers(ctx context.Context, s *slot, grace time.Duration) error {
	r.mu.Lock()
	ids := slices.Clone(s.containers)
	r.mu.Unlock()
	var wg sync.WaitGroup
	errs := make([]error, len(ids))
	for i, id := range ids {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = r.removeContainer(ctx, id, grace)
		}()
	}
	wg.Wait()
	r.mu.Lock()
	freed := false
	for _, id := range ids {
		freed = r.cpus.releaseLocked(id) || freed
	}
	r.mu.Unlock()
	if freed {
		r.rebalanceCPUs() // the freed cores rejoin the shared pool
	}
	return errors.Join(errs...)
}

func (r *Runtime) removeContainer(ctx context.Context, id string, grace time.Duration) error {
	container, err := r.client.LoadContainer(ctx, id)
	if errdefs.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if task, err := container.Task(ctx, nil); err == nil {
		var opts []ctrd.ProcessDeleteOpts
		if exit, err := task.Wait(ctx); err == nil {
			exited := false
			wait := func(d time.Duration) {
				t := r.cfg.Clock.NewTimer(d)
				defer t.Stop()
				select {
				case <-exit:
					exited = true
				case <-t.C():
				}
			}
			if grace > 0 {
				_ = task.Kill(ctx, syscall.SIGTERM)
				wait(grace)
			}
			if !exited {
				_ = task.Kill(ctx, syscall.SIGKILL, ctrd.WithKillAll)
				wait(10 * time.Second)
			}
			// Not killed again once a gVisor sandbox has exited: runsc,
			// unlike runc, answers a kill of a stopped sandbox with an
			// error the shim does not take for "already finished", and
			// the delete would fail. runc tasks keep the kill before the
			// delete (a pod's containers share a shim and are removed
			// at once; the kill's wait orders their deletes).
			if !exited || !r.isGVisor(ctx, container) {
				opts = append(opts, ctrd.WithProcessKill)
			}
		} else {
			opts = append(opts, ctrd.WithProcessKill)
		}
		if _, err := task.Delete(ctx, opts...); err != nil && !errdefs.IsNotFound(err) {
			return fmt.Errorf("delete task %s: %w", id, err)
		}
	} else if !errdefs.IsNotFound(err) {
		return fmt.Errorf("task of %s: %w", id, err)
	} else {
		killOrphanShim(r.cfg.Namespace, id)
	}
	if err := container.Delete(ctx, ctrd.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		return fmt.Errorf("delete container %s: %w", id, err)
	}
	return nil
}

// Watch implements runtime.Runtime.
func (r *Runtime) Watch(ctx context.Context) (runtime.Inventory, <-chan runtime.Event, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
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
		Node:     r.cfg.Node,
		Capacity: runtime.Capacity{Slots: r.cfg.Slots, Resources: r.cfg.Resources},
		Slots:    make([]runtime.Slot, 0, len(r.slots)),
		// Lock order: r.mu, then the image manager's.
		ReadyImages: r.images.Ready(),
		Draining:    r.draining,
	}
	for _, s := range r.slots {
		inv.Slots = append(inv.Slots, s.Slot.Clone())
	}
	slices.SortFunc(inv.Slots, func(a, b runtime.Slot) int { return strings.Compare(a.ID, b.ID) })
	return inv
}

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
	r.hub.Close()
	return errors.Join(errs...)
}

// newTask creates container's task, again when it met its group's shim on
// its way out.
func (r *Runtime) newTask(ctx context.Context, container ctrd.Container) (ctrd.Task, error) {
	var task ctrd.Task
	var err error
	for attempt := range 4 {
		task, err = container.NewTask(ctx, nullIO)
		if err == nil || !shimGone(err) {
			break
		}
		// The group's shim was exiting as this task asked for it (its last
		// container had just gone): the next attempt starts a new one.
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-r.cfg.Clock.After(time.Duration(attempt+1) * 20 * time.Millisecond):
		}
	}
	return task, err
}

// shimGone reports a task creation that met a shim on its way out.
func shimGone(err error) bool {
	msg := err.Error()
	return errdefs.IsUnavailable(err) || strings.Contains(msg, "ttrpc: closed") ||
		strings.Contains(msg, "transport is closing") || strings.Contains(msg, "failed to start shim")
}

// killOrphanShim kills the shim of container id in namespace ns, if one
// runs though containerd knows no task of id: a task create cut off by a
// containerd restart leaves its shim running, and nothing else ever ends
// it. Only a shim started for exactly this container of sandman's own
// namespace is killed, as the container is being removed. Where the agent
// cannot see the node's processes (pod mode without the host's PID
// namespace) it finds none.
func killOrphanShim(ns, id string) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !bytes.Contains(b, []byte("containerd-shim")) {
			continue
		}
		args := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
		if !strings.HasPrefix(filepath.Base(args[0]), "containerd-shim") {
			continue
		}
		var gotNS, gotID string
		for i := 1; i+1 < len(args); i++ {
			switch args[i] {
			case "-namespace":
				gotNS = args[i+1]
			case "-id":
				gotID = args[i+1]
			}
		}
		if gotNS == ns && gotID == id {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

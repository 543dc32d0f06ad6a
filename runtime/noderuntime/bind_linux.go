package noderuntime

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime"
)

// Bind: a warm (or hot) slot reserved for the pod, its images, its
// containers created and started, then watched until their daemons answer.

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
		s.diskLimits, s.diskUsed, s.evicted, s.earlyExits, s.lazyLowers = nil, nil, "", nil, nil
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
	// And it runs under runc: a gVisor pod takes a warm slot. A pod that
	// asks for root and nothing else takes a hot sandbox that runs as
	// root (hotRoot).
	hotAny := len(req.Containers) == 1 && req.Containers[0].ExclusiveCPUs == 0 && !req.GVisor()
	hotOK := hotAny && req.Containers[0].DefaultSecurity()
	hotRootOK := hotAny && req.Containers[0].RootOtherwiseDefault()
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
			if (hotOK || (hotRootOK && s.hotRoot)) && hotSlot == nil && s.Image == req.Containers[0].Image && s.userNS == wantNS {
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
	var fork *forkImage
	if req.Fork != nil {
		t = time.Now()
		if err := r.checkForkMemory(ctx, req); err != nil {
			return fmt.Errorf("bind %s: %w", req.Pod.UID, err)
		}
		var err error
		if fork, err = r.acquireFork(ctx, req); err != nil {
			return fmt.Errorf("bind %s: %w", req.Pod.UID, err)
		}
		defer r.releaseFork(fork)
		r.metrics.observePhase("fork", t)
		a.Bearer = fork.assignKey
	} else if req.Restore != nil {
		t = time.Now()
		var err error
		if fork, err = r.fetchMoved(ctx, s, req); err != nil {
			return fmt.Errorf("bind %s: restore the moved sandbox: %w", req.Pod.UID, err)
		}
		defer r.releaseFork(fork)
		r.metrics.observePhase("restore", t)
		a.Bearer = fork.assignKey
	}
	// The daemon's command line names the hash of its assign token; a
	// fork's names its source's, as runsc's restore wants the same.
	specHash := a.hash()
	if fork != nil {
		specHash = fork.specHash
	}
	if err := a.save(s.dir); err != nil {
		return fmt.Errorf("bind %s: %w", req.Pod.UID, err)
	}
	for i, c := range req.Containers {
		id := s.ID + "-" + c.Name
		spec, err := r.specOpts(s, req, i, images[i], specHash, false)
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
			// Cut short, containerd may have made the container all the
			// same: it goes. The snapshot is made before the spec: a spec
			// that fails leaves it, and the slot's next bind would meet it.
			if !errdefs.IsAlreadyExists(err) {
				if rerr := r.removeContainer(context.WithoutCancel(ctx), id, 0); rerr != nil {
					err = errors.Join(err, fmt.Errorf("remove the container: %w", rerr))
				}
			}
			if rerr := r.client.SnapshotService(r.cfg.Snapshotter).Remove(context.WithoutCancel(ctx), id); rerr != nil && !errdefs.IsNotFound(rerr) {
				err = errors.Join(err, fmt.Errorf("remove its snapshot: %w", rerr))
			}
			return fmt.Errorf("bind %s: create container %s: %w", req.Pod.UID, c.Name, err)
		}
		r.mu.Lock()
		s.containers = append(s.containers, id)
		r.setDiskLimitLocked(s, id, c.DiskBytes)
		r.mu.Unlock()
		if r.cfg.LazyPull {
			r.recordLazyLowers(ctx, s, id)
		}
		r.metrics.observePhase("create", t)
		t = time.Now()
		if fork != nil {
			done, err := r.startFork(ctx, fork, id)
			if err != nil {
				return fmt.Errorf("bind %s: start from %s's state: %w", req.Pod.UID, fork.source, err)
			}
			defer done()
		}
		if err := r.startTask(ctx, s, container, c.Name); err != nil {
			if req.Restore != nil {
				return fmt.Errorf("bind %s: restore the moved sandbox: runsc restore: %v: %w", req.Pod.UID, err, errdefs.ErrDataLoss)
			}
			return fmt.Errorf("bind %s: start container %s: %w", req.Pod.UID, c.Name, err)
		}
		if req.Restore != nil {
			// It runs: its state is no longer needed in the registry.
			pod, ref := req.Pod, req.Restore.Ref
			r.owned.Go(func() {
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
				defer cancel()
				if err := r.DeleteCheckpoint(dctx, pod, ref); err != nil {
					r.log.Warn("delete a restored sandbox's checkpoint from the registry", "ref", ref, "err", err)
				}
			})
		}
		r.metrics.observePhase("start", t)
	}
	r.watchReady(s, req.Pod.UID, a)
	return nil
}

package noderuntime

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	cgroups "github.com/containerd/cgroups/v3"
	"github.com/containerd/cgroups/v3/cgroup2"
	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/internal/lifecycle"
	"github.com/sandman-dev/sandman/runtime"
)

// heat plans the hot pool from the bind mix (hotTargets), cools down idle
// hot sandboxes of images over their target (hotSurplus) and starts hot
// sandboxes in warm slots where an image is short, within HotSlots in all,
// in goroutines counted in wg (Run's).
func (r *Runtime) heat(ctx context.Context, wg *sync.WaitGroup) {
	if r.cfg.HotSlots == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.draining != "" {
		return // shedIdle tears hot slots down
	}
	now := r.cfg.Clock.Now()
	targets := hotTargets(r.cfg.HotSlots, r.cfg.HotImages, r.mix.demand(now))
	r.hotPlan = targets
	have := map[string]int{}
	var idle []*slot // hot and waiting, oldest first
	for _, s := range r.slots {
		if s.State == runtime.StateHot || s.heating {
			have[s.Image]++
		}
		if s.State == runtime.StateHot {
			idle = append(idle, s)
		}
	}
	slices.SortFunc(idle, func(a, b *slot) int { return a.Since.Compare(b.Since) })
	surplus := hotSurplus(targets, have)
	coolAfter := hotCoolAfter(r.cfg.HotMixHalfLife)
	for _, s := range idle {
		if surplus[s.Image] == 0 || now.Sub(s.Since) < coolAfter {
			continue
		}
		surplus[s.Image]--
		have[s.Image]--
		r.coolIdleLocked(s, wg)
	}
	total := 0
	for _, n := range have {
		total += n
	}
	// The images furthest below their target first.
	short := slices.Collect(maps.Keys(targets))
	slices.SortFunc(short, func(a, b string) int {
		fa, fb := float64(have[a])/float64(targets[a]), float64(have[b])/float64(targets[b])
		return cmp.Or(cmp.Compare(fa, fb), cmp.Compare(a, b))
	})
	for _, img := range short {
		if f, ok := r.hotFailures[img]; ok && now.Before(f.until) {
			continue // backing off after a failed start
		}
		for ; have[img] < targets[img] && total < r.cfg.HotSlots && r.heating < r.cfg.RefillConcurrency; have[img]++ {
			var warm *slot
			for _, s := range r.slots {
				if s.State == runtime.StateWarm && !s.heating {
					warm = s
					break
				}
			}
			if warm == nil {
				return
			}
			warm.heating, warm.Image = true, img
			r.heating++
			total++
			wg.Go(func() { r.startHot(ctx, warm, img) })
		}
	}
}

// coolIdleLocked removes s's waiting hot sandbox, which no pod holds, in a
// goroutine counted in wg; the slot is releasing meanwhile (no bind takes
// it, a drain leaves it), then warm.
func (r *Runtime) coolIdleLocked(s *slot, wg *sync.WaitGroup) {
	ids := s.containers
	// Its exit watch finds it released: no exit event, no cool-down twice.
	s.containers, s.assignToken = nil, ""
	r.log.Info("cooling down hot sandbox", "slot", s.ID, "image", s.Image)
	r.setLocked(s, runtime.StateReleasing)
	r.metrics.hotCooldowns.Inc()
	wg.Go(func() {
		// Finishes even when Run stops: Close waits for it.
		ctx := r.nsCtx(context.Background())
		var errs []error
		for _, id := range ids {
			errs = append(errs, r.removeContainer(ctx, id, 0))
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		s.Image = ""
		if err := errors.Join(errs...); err != nil {
			r.log.Warn("cool down hot sandbox", "slot", s.ID, "err", err)
			s.Reason, s.leftovers = err.Error(), ids
			r.setLocked(s, runtime.StateBroken)
			return
		}
		r.setLocked(s, runtime.StateWarm)
		r.wake()
	})
}

// startHot starts img's sandbox in s with a daemon waiting to be assigned.
func (r *Runtime) startHot(ctx context.Context, s *slot, image string) {
	err := r.startHotWork(ctx, s, image)
	r.mu.Lock()
	r.heating--
	s.heating = false
	if err == nil {
		delete(r.hotFailures, image)
		r.setLocked(s, runtime.StateHot)
		r.mu.Unlock()
		return
	}
	// The image's next hot start waits: 1 s, doubling to 5 min.
	f := r.hotFailures[image]
	f.delay = nextHotBackoff(f.delay)
	f.until = r.cfg.Clock.Now().Add(f.delay)
	if r.hotFailures == nil {
		r.hotFailures = map[string]hotFailure{}
	}
	r.hotFailures[image] = f
	r.mu.Unlock()
	if ctx.Err() == nil {
		r.log.Warn("start hot sandbox", "slot", s.ID, "image", image, "err", err, "retry_in", f.delay.String())
		r.owned.Go(func() {
			if lifecycle.Sleep(r.life, r.cfg.Clock, f.delay) {
				r.wake()
			}
		})
	}
	_ = r.removeContainers(context.WithoutCancel(ctx), s, 0)
	r.mu.Lock()
	s.Image, s.containers, s.assignToken = "", nil, ""
	r.mu.Unlock()
	r.wake()
}

func (r *Runtime) startHotWork(ctx context.Context, s *slot, image string) error {
	// No pod yet: a private image's hot sandbox is handed over only after
	// Bind's authorizeImages.
	img, err := r.images.EnsureForNode(ctx, image)
	if err != nil {
		return markImagePull(err)
	}
	var tok [16]byte
	_, _ = rand.Read(tok[:])
	token := hex.EncodeToString(tok[:])
	sum := sha256.Sum256([]byte(token))
	req := runtime.BindRequest{
		Pod:        runtime.PodRef{Name: "sandbox"},
		Containers: []runtime.ContainerSpec{{Name: "task", Image: image}},
	}
	id := s.ID + hotSuffix
	spec, err := r.specOpts(s, req, 0, img, hex.EncodeToString(sum[:]), true)
	if err != nil {
		return err
	}
	container, err := r.client.NewContainer(ctx, id, r.containerOpts(id, img, spec, map[string]string{
		LabelNode: r.cfg.Node, LabelSlot: s.ID, LabelContainer: "task", LabelIndex: "0", LabelImage: image, LabelHot: "true",
	})...)
	if err != nil {
		// Cut short (the agent stopping), containerd may have made the
		// container all the same: it goes, or it would outlive the agent.
		if rerr := r.removeContainer(context.WithoutCancel(ctx), id, 0); rerr != nil {
			err = errors.Join(err, fmt.Errorf("remove the container: %w", rerr))
		}
		if rerr := r.client.SnapshotService(r.cfg.Snapshotter).Remove(context.WithoutCancel(ctx), id); rerr != nil && !errdefs.IsNotFound(rerr) {
			err = errors.Join(err, fmt.Errorf("remove its snapshot: %w", rerr))
		}
		return err
	}
	// Whether it runs as root: a pod that asks for root and nothing
	// else may take it then.
	root := false
	if sp, err := container.Spec(ctx); err == nil && sp.Process != nil {
		root = sp.Process.User.UID == 0 && sp.Process.User.GID == 0
	}
	r.mu.Lock()
	s.containers, s.assignToken, s.userNS, s.hotRoot = []string{id}, token, spec.idBase != 0, root
	r.mu.Unlock()
	if err := r.startTask(ctx, s, container, "task"); err != nil {
		return err
	}
	// Hot means the daemon answers.
	url := "http://" + s.IP + ":" + strconv.Itoa(api.Port) + "/v1/health"
	deadline := r.cfg.Clock.Now().Add(r.cfg.ReadyTimeout)
	for {
		hreq, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := r.health.Do(hreq); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if r.cfg.Clock.Now().After(deadline) {
			return fmt.Errorf("the hot sandbox's daemon did not answer within %v", r.cfg.ReadyTimeout)
		}
		if !lifecycle.Sleep(ctx, r.cfg.Clock, 5*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// assignHot hands a hot slot's running sandbox to the pod: its labels,
// resource limits and hostname are set, then its daemon is assigned the
// pod's tokens, env and command.
func (r *Runtime) assignHot(ctx context.Context, s *slot, req runtime.BindRequest, token string) error {
	begin := time.Now()
	r.mu.Lock()
	id := s.containers[0]
	r.mu.Unlock()
	c := req.Containers[0]
	container, err := r.client.LoadContainer(ctx, id)
	if err != nil {
		return err
	}
	task, err := container.Task(ctx, nil)
	if err != nil {
		return err
	}
	if res := linuxResources(c, r.cfg.PidsLimit); res != nil {
		// Writing the cgroup directly takes microseconds; runc update
		// (task.Update) forks runc and takes tens of milliseconds.
		if err := updateCgroup("/"+r.cfg.Namespace+"/"+id, res); err != nil {
			r.log.Debug("direct cgroup update failed; using runc update", "err", err)
			if err := task.Update(ctx, ctrd.WithResources(res)); err != nil {
				return fmt.Errorf("set limits of hot sandbox: %w", err)
			}
		}
	}
	hostname := req.Hostname
	if hostname == "" {
		hostname = req.Pod.Name
	}
	if len(hostname) > 63 {
		hostname = hostname[:63]
	}
	if err := r.bindFirewall(s, &req); err != nil {
		return err
	}
	if err := r.shape(s, &req); err != nil {
		return err
	}
	tLimits := time.Now()
	if err := setHostname(task.Pid(), hostname); err != nil {
		return fmt.Errorf("set hostname of hot sandbox: %w", err)
	}
	tHost := time.Now()
	img, err := container.Image(ctx)
	if err != nil {
		return err
	}
	main, err := mainCommand(ctx, c, img)
	if err != nil {
		return err
	}
	body, _ := json.Marshal(api.AssignRequest{
		TokenHashes: req.TokenHashes, AllowUnauthenticated: req.AllowUnauthenticated,
		Env: c.Env, Dir: c.WorkingDir, Main: main, RestartPolicy: req.RestartPolicy,
	})
	hreq, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+s.IP+":"+strconv.Itoa(api.Port)+"/v1/assign", bytes.NewReader(body))
	hreq.Header.Set("Authorization", "Bearer "+token)
	resp, err := r.health.Do(hreq)
	if err != nil {
		return fmt.Errorf("assign hot sandbox: %w", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("assign hot sandbox: daemon answered %s", resp.Status)
	}
	r.mu.Lock()
	s.assignToken = ""
	r.setDiskLimitLocked(s, id, c.DiskBytes)
	r.mu.Unlock()
	if r.cfg.LazyPull {
		r.recordLazyLowers(ctx, s, id)
	}
	r.metrics.observePhase("assign", begin)
	r.log.Debug("assigned hot sandbox", "slot", s.ID, "limits", tLimits.Sub(begin),
		"hostname", tHost.Sub(tLimits), "assign", time.Since(tHost))
	// The labels that let a restarted agent re-adopt the pod are written
	// after the pod has its sandbox: a containerd metadata write costs
	// ~20 ms here. An agent killed in between loses this one sandbox (the
	// virtual node then reports the pod lost).
	r.owned.Go(func() {
		labels := map[string]string{
			LabelPodUID: req.Pod.UID, LabelPodNamespace: req.Pod.Namespace, LabelPodName: req.Pod.Name,
			LabelVirtualNode: req.VirtualNode, LabelContainer: c.Name, LabelRequests: formatRequests(req.Requests()), LabelHot: "assigned",
		}
		maps.Copy(labels, req.Labels)
		if _, err := container.SetLabels(context.WithoutCancel(ctx), labels); err != nil {
			r.log.Warn("label assigned hot sandbox", "slot", s.ID, "err", err)
		}
	})
	r.watchReady(s, req.Pod.UID, nil)
	return nil
}

// coolDown removes a hot sandbox that exited and makes the slot warm.
func (r *Runtime) coolDown(s *slot) {
	ctx := r.nsCtx(context.Background())
	r.mu.Lock()
	ids := slices.Clone(s.containers)
	r.mu.Unlock()
	err := r.removeContainers(ctx, s, 0)
	r.mu.Lock()
	defer r.mu.Unlock()
	s.Image, s.containers, s.assignToken = "", nil, ""
	if err != nil {
		s.Reason, s.leftovers = err.Error(), ids
		r.setLocked(s, runtime.StateBroken)
		return
	}
	r.setLocked(s, runtime.StateWarm)
	r.wake()
}

// linuxResources are the limits to write to a hot sandbox's cgroup for c:
// its memory and CPU, and its pids limit when below the node's (nodePids,
// which the hot sandbox started with).
func linuxResources(c runtime.ContainerSpec, nodePids int64) *specs.LinuxResources {
	var res specs.LinuxResources
	set := false
	if p := c.PidsLimit; p > 0 && p < nodePids {
		res.Pids = &specs.LinuxPids{Limit: &p}
		set = true
	}
	if m := c.Limits.MemoryBytes; m > 0 {
		res.Memory = &specs.LinuxMemory{Limit: &m, Swap: &m}
		set = true
	}
	cpu := &specs.LinuxCPU{}
	if l := c.Limits.MilliCPU; l > 0 {
		q, p := l*100, uint64(100000)
		cpu.Quota, cpu.Period = &q, &p
		set = true
	}
	if rq := c.Requests.MilliCPU; rq > 0 {
		sh := uint64(max(2, rq*1024/1000))
		cpu.Shares = &sh
		set = true
	}
	if cpu.Quota != nil || cpu.Shares != nil {
		res.CPU = cpu
	}
	if !set {
		return nil
	}
	return &res
}

// setHostname sets the hostname in the UTS namespace of pid, from a thread
// that joins it and is then thrown away.
func setHostname(pid uint32, name string) error {
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread dies with the goroutine
		f, err := os.Open(fmt.Sprintf("/proc/%d/ns/uts", pid))
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWUTS); err != nil {
			errc <- err
			return
		}
		errc <- unix.Sethostname([]byte(name))
	}()
	return <-errc
}

// updateCgroup applies res to the container's cgroup (the default spec's
// cgroupsPath, /<namespace>/<id>).
func updateCgroup(path string, res *specs.LinuxResources) error {
	if cgroups.Mode() != cgroups.Unified {
		return updateCgroupV1(path, res)
	}
	m, err := cgroup2.Load(path)
	if err != nil {
		return err
	}
	return m.Update(cgroup2.ToResources(res))
}

// updateCgroupV1 writes the few v1 files a sandbox's limits touch.
func updateCgroupV1(path string, res *specs.LinuxResources) error {
	write := func(ctl, file string, v int64) error {
		return os.WriteFile(filepath.Join("/sys/fs/cgroup", ctl, path, file), []byte(strconv.FormatInt(v, 10)), 0)
	}
	if m := res.Memory; m != nil && m.Limit != nil {
		if err := write("memory", "memory.limit_in_bytes", *m.Limit); err != nil {
			return err
		}
		if m.Swap != nil {
			_ = write("memory", "memory.memsw.limit_in_bytes", *m.Swap) // absent without swap accounting
		}
	}
	if p := res.Pids; p != nil && p.Limit != nil {
		if err := write("pids", "pids.max", *p.Limit); err != nil {
			return err
		}
	}
	if c := res.CPU; c != nil {
		if c.Period != nil {
			if err := write("cpu", "cpu.cfs_period_us", int64(*c.Period)); err != nil {
				return err
			}
		}
		if c.Quota != nil {
			if err := write("cpu", "cpu.cfs_quota_us", *c.Quota); err != nil {
				return err
			}
		}
		if c.Shares != nil {
			if err := write("cpu", "cpu.shares", int64(*c.Shares)); err != nil {
				return err
			}
		}
	}
	return nil
}

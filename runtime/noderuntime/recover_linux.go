package noderuntime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/netns"
	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime"
)

// recover rebuilds the slots from containerd's labels and the state
// directory: slots whose containers all run are re-adopted as bound (their
// sandboxes never stopped); warm slots whose namespace is intact are kept;
// everything else — containers of half-made or dead sandboxes, orphaned
// namespaces, directories and shims — is removed.
func (r *Runtime) recover(ctx context.Context) error {
	containers, err := r.client.Containers(ctx, fmt.Sprintf(`labels."%s"==%s`, LabelNode, r.cfg.Node))
	if err != nil {
		return fmt.Errorf("list containers: %w", err)
	}
	bySlot := map[string][]ctrd.Container{}
	var holders []ctrd.Container
	for _, c := range containers {
		labels, err := c.Labels(ctx)
		if err != nil {
			return err
		}
		if labels[LabelHolder] == "true" {
			holders = append(holders, c) // no sandbox: see recoverHolders
			continue
		}
		bySlot[labels[LabelSlot]] = append(bySlot[labels[LabelSlot]], c)
	}
	var errs []error
	for id, cs := range bySlot {
		dir := filepath.Join(r.slotsDir(), id)
		s, err := r.adopt(ctx, id, dir, cs)
		if err == nil {
			r.mu.Lock()
			s.group = r.rejoinGroupLocked(s.group)
			r.mu.Unlock()
			r.slots[id] = s
			r.byPod[s.Pod.UID] = s
			r.log.Info("re-adopted a running sandbox", "slot", id, "pod", s.Pod.Namespace+"/"+s.Pod.Name)
			continue
		}
		r.log.Info("removing a sandbox that cannot be re-adopted", "slot", id, "reason", err)
		for _, c := range cs {
			if err := r.removeContainer(ctx, c.ID(), 0); err != nil {
				errs = append(errs, err)
			}
		}
		meta, _ := readMeta(dir)
		if err := r.destroySlot(ctx, id, meta.NetNS, dir); err != nil {
			errs = append(errs, err)
		}
	}
	// Warm slots without containers.
	entries, _ := os.ReadDir(r.slotsDir())
	for _, e := range entries {
		id := e.Name()
		if _, ok := r.slots[id]; ok {
			continue
		}
		dir := filepath.Join(r.slotsDir(), id)
		meta, err := readMeta(dir)
		// A warm slot of an older agent gets today's firewall.
		if err == nil && meta.ID == id && meta.IP != "" && netnsMounted(meta.NetNS) && len(r.slots) < r.cfg.Slots &&
			firewallOK(r.firewall(meta.NetNS, meta.IP, nil, false)) && allowLowPorts(meta.NetNS) == nil {
			r.mu.Lock()
			group := r.joinGroupLocked()
			r.mu.Unlock()
			r.slots[id] = &slot{
				Slot:  runtime.Slot{ID: id, State: runtime.StateWarm, IP: meta.IP, Since: r.cfg.Clock.Now()},
				netns: netns.LoadNetNS(meta.NetNS), dir: dir, group: group, fwClean: true,
			}
			continue
		}
		if err := r.destroySlot(ctx, id, meta.NetNS, dir); err != nil {
			errs = append(errs, err)
		}
	}
	// Namespaces no slot refers to (an agent killed while making a slot).
	known := map[string]bool{}
	for _, s := range r.slots {
		known[s.netns.GetPath()] = true
	}
	nsEntries, _ := os.ReadDir(r.netnsDir())
	for _, e := range nsEntries {
		p := filepath.Join(r.netnsDir(), e.Name())
		if !known[p] {
			if err := netns.LoadNetNS(p).Remove(); err != nil {
				errs = append(errs, fmt.Errorf("remove orphaned netns %s: %w", p, err))
			}
		}
	}
	// Checkpoints of slots that are not paused (an agent killed mid-pause
	// or mid-release).
	cps, _ := os.ReadDir(r.cfg.CheckpointDir)
	for _, e := range cps {
		if s, ok := r.slots[e.Name()]; ok && s.State == runtime.StatePaused {
			continue
		}
		if err := os.RemoveAll(filepath.Join(r.cfg.CheckpointDir, e.Name())); err != nil {
			errs = append(errs, err)
		}
	}
	errs = append(errs, r.recoverHolders(ctx, holders))
	r.reapShims()
	return errors.Join(errs...)
}

// recoverHolders keeps one running holder per shim group that has slots,
// removes the others and starts the holders groups lack.
func (r *Runtime) recoverHolders(ctx context.Context, holders []ctrd.Container) error {
	var errs []error
	for _, c := range holders {
		labels, err := c.Labels(ctx)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		group := labels[LabelShimGroup]
		r.mu.Lock()
		g := r.groups[group]
		wanted := g != nil && g.holder == ""
		r.mu.Unlock()
		if wanted {
			if exit, err := runningTaskWait(ctx, c, r.life); err == nil {
				r.mu.Lock()
				g.holder = c.ID()
				r.mu.Unlock()
				r.owned.Go(func() { r.watchHolder(group, c.ID(), exit) })
				r.log.Info("re-adopted a shim group holder", "group", group, "holder", c.ID())
				continue
			}
		}
		r.log.Info("removing a shim group holder no group needs", "group", group, "holder", c.ID())
		errs = append(errs, r.removeHolder(ctx, c.ID()))
	}
	r.mu.Lock()
	var lacking []string
	for name, g := range r.groups {
		if g.holder == "" {
			lacking = append(lacking, name)
		}
	}
	r.mu.Unlock()
	for _, name := range lacking {
		if err := r.ensureHolder(ctx, name); err != nil {
			// Not fatal: the group's next bind tries again.
			r.log.Warn("start a shim group holder", "group", name, "err", err)
		}
	}
	return errors.Join(errs...)
}

// runningTaskWait is the exit of c's task (waited on with life) if it runs.
func runningTaskWait(ctx context.Context, c ctrd.Container, life context.Context) (<-chan ctrd.ExitStatus, error) {
	task, err := c.Task(ctx, nil)
	if err != nil {
		return nil, err
	}
	st, err := task.Status(ctx)
	if err != nil {
		return nil, err
	}
	if st.Status != ctrd.Running {
		return nil, fmt.Errorf("holder %s is %s", c.ID(), st.Status)
	}
	return task.Wait(life)
}

// adopt re-adopts a slot whose containers all have running tasks.
func (r *Runtime) adopt(ctx context.Context, id, dir string, cs []ctrd.Container) (*slot, error) {
	meta, err := readMeta(dir)
	if err != nil {
		return nil, fmt.Errorf("slot metadata: %w", err)
	}
	if !netnsMounted(meta.NetNS) {
		return nil, errors.New("its network namespace is gone")
	}
	// A paused sandbox (checkpoint_linux.go): its containers have no task.
	var paused *pausedMeta
	if b, err := os.ReadFile(pausedFile(dir)); err == nil {
		var m pausedMeta
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("paused marker: %w", err)
		}
		if len(cs) != 1 {
			return nil, fmt.Errorf("a paused sandbox of %d containers", len(cs))
		}
		paused = &m
	}
	type member struct {
		index int
		c     ctrd.Container
		name  string
		task  ctrd.Task
	}
	var members []member
	var labels map[string]string
	group := "" // the shim group the sandbox runs in
	for _, c := range cs {
		l, err := c.Labels(ctx)
		if err != nil {
			return nil, err
		}
		var task ctrd.Task
		if paused == nil {
			if task, err = c.Task(ctx, nil); err != nil {
				return nil, fmt.Errorf("container %s has no task: %w", c.ID(), err)
			}
			st, err := task.Status(ctx)
			if err != nil || st.Status != ctrd.Running {
				return nil, fmt.Errorf("container %s is not running (%v, %v)", c.ID(), st.Status, err)
			}
		} else if _, err := c.Task(ctx, nil); err == nil {
			return nil, fmt.Errorf("container %s of a paused sandbox has a task", c.ID())
		}
		if cpus, err := parseCPUList(l[LabelExclusiveCPUs]); err == nil {
			for _, cpu := range cpus {
				r.cpus.owner[cpu] = c.ID()
			}
		}
		idx, _ := strconv.Atoi(l[LabelIndex])
		members = append(members, member{idx, c, l[LabelContainer], task})
		if idx == 0 {
			labels = l
			if spec, err := c.Spec(ctx); err == nil {
				group = spec.Annotations[groupAnnotation]
			}
		}
	}
	if labels == nil || labels[LabelPodUID] == "" {
		return nil, errdefs.ErrNotFound
	}
	slices.SortFunc(members, func(a, b member) int { return a.index - b.index })
	s := &slot{
		Slot: runtime.Slot{
			ID: id, State: runtime.StateBound, IP: meta.IP, Image: labels[LabelImage], Since: r.cfg.Clock.Now(),
			Pod:       &runtime.PodRef{UID: labels[LabelPodUID], Namespace: labels[LabelPodNamespace], Name: labels[LabelPodName]},
			Resources: parseRequests(labels[LabelRequests]),
		},
		netns: netns.LoadNetNS(meta.NetNS), dir: dir, group: group,
	}
	if base, err := strconv.ParseUint(labels[LabelUserNS], 10, 32); err == nil {
		s.idBase = uint32(base) // no other sandbox takes the range while this one runs
	}
	if paused != nil {
		if paused.PodUID != s.Pod.UID {
			return nil, fmt.Errorf("paused marker of pod %s, container of pod %s", paused.PodUID, s.Pod.UID)
		}
		s.State, s.checkpointBytes, s.containers = runtime.StatePaused, paused.Bytes, []string{members[0].c.ID()}
		return s, nil
	}
	for _, m := range members {
		// The exit watch lasts as long as the runtime, not New's ctx.
		exit, err := m.task.Wait(r.life)
		if err != nil {
			return nil, err
		}
		s.containers = append(s.containers, m.c.ID())
		r.owned.Go(func() { r.watchExit(s, m.c.ID(), m.name, exit, 0) })
	}
	r.watchReady(s, s.Pod.UID, loadAssignment(dir))
	return s, nil
}

func formatRequests(res runtime.Resources) string {
	return strconv.FormatInt(res.MilliCPU, 10) + "," + strconv.FormatInt(res.MemoryBytes, 10)
}

func parseRequests(v string) runtime.Resources {
	var res runtime.Resources
	cpu, mem, ok := strings.Cut(v, ",")
	if !ok {
		return res
	}
	res.MilliCPU, _ = strconv.ParseInt(cpu, 10, 64)
	res.MemoryBytes, _ = strconv.ParseInt(mem, 10, 64)
	return res
}

// firewallOK: a firewall write without error.
func firewallOK(_ bool, err error) bool { return err == nil }

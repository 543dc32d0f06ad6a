package containerd

import (
	"context"
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

// LabelRequests keeps the pod's summed requests ("milliCPU,bytes") so a
// restarted agent accounts for them.
const LabelRequests = "sandman.io/requests"

// recover rebuilds the slots from containerd's labels and the state
// directory: slots whose containers all run are re-adopted as bound (their
// sandboxes never stopped); warm slots whose namespace is intact are kept;
// everything else — containers of half-made or dead sandboxes, orphaned
// namespaces and directories — is removed.
func (r *Runtime) recover(ctx context.Context) error {
	containers, err := r.client.Containers(ctx, fmt.Sprintf(`labels."%s"==%s`, LabelNode, r.cfg.Node))
	if err != nil {
		return fmt.Errorf("list containers: %w", err)
	}
	bySlot := map[string][]ctrd.Container{}
	for _, c := range containers {
		labels, err := c.Labels(ctx)
		if err != nil {
			return err
		}
		bySlot[labels[LabelSlot]] = append(bySlot[labels[LabelSlot]], c)
	}
	var errs []error
	for id, cs := range bySlot {
		dir := filepath.Join(r.slotsDir(), id)
		s, err := r.adopt(ctx, id, dir, cs)
		if err == nil {
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
			firewallOK(r.firewall(meta.NetNS, nil, false)) && allowLowPorts(meta.NetNS) == nil {
			r.slots[id] = &slot{
				Slot:  runtime.Slot{ID: id, State: runtime.StateWarm, IP: meta.IP, Since: r.cfg.Clock.Now()},
				netns: netns.LoadNetNS(meta.NetNS), dir: dir, group: r.nextGroup(), fwClean: true,
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
	return errors.Join(errs...)
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
	type member struct {
		index int
		c     ctrd.Container
		name  string
		task  ctrd.Task
	}
	var members []member
	var labels map[string]string
	for _, c := range cs {
		l, err := c.Labels(ctx)
		if err != nil {
			return nil, err
		}
		task, err := c.Task(ctx, nil)
		if err != nil {
			return nil, fmt.Errorf("container %s has no task: %w", c.ID(), err)
		}
		st, err := task.Status(ctx)
		if err != nil || st.Status != ctrd.Running {
			return nil, fmt.Errorf("container %s is not running (%v, %v)", c.ID(), st.Status, err)
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
		netns: netns.LoadNetNS(meta.NetNS), dir: dir, group: r.nextGroup(),
	}
	if base, err := strconv.ParseUint(labels[LabelUserNS], 10, 32); err == nil {
		s.idBase = uint32(base) // no other sandbox takes the range while this one runs
	}
	for _, m := range members {
		// The exit watch lasts as long as the runtime, not New's ctx.
		exit, err := m.task.Wait(r.life)
		if err != nil {
			return nil, err
		}
		s.containers = append(s.containers, m.c.ID())
		r.goOwned(func() { r.watchExit(s, m.c.ID(), m.name, exit) })
	}
	r.watchReady(s, s.Pod.UID)
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

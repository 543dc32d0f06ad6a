package noderuntime

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/containerd/cgroups/v3"
	"github.com/containerd/errdefs"
)

// cpuSets hands out whole cores to pods that ask for exclusive CPUs
// (Guaranteed QoS with integer CPU requests, the evaluation mode), as
// kubelet's static CPU manager does: exclusive cores leave the shared pool,
// and every other container runs on the shared pool only.
type cpuSets struct {
	// all are the node's online CPUs; reserved stay in the shared pool.
	all      []int
	reserved []int
	// owner maps an exclusive CPU to the container holding it. Guarded by
	// Runtime.mu.
	owner map[int]string
}

func newCPUSets(reserved string) (*cpuSets, error) {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return nil, err
	}
	all, err := parseCPUList(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, err
	}
	res, err := parseCPUList(reserved)
	if err != nil {
		return nil, fmt.Errorf("reserved CPUs %q: %w", reserved, err)
	}
	return &cpuSets{all: all, reserved: res, owner: map[int]string{}}, nil
}

// allocateLocked gives container id n free exclusive cores.
func (c *cpuSets) allocateLocked(id string, n int) ([]int, error) {
	var free []int
	for _, cpu := range c.all {
		if _, taken := c.owner[cpu]; !taken && !slices.Contains(c.reserved, cpu) {
			free = append(free, cpu)
		}
	}
	if len(free) < n {
		return nil, fmt.Errorf("%d exclusive CPUs asked, %d free on this node: %w", n, len(free), errdefs.ErrResourceExhausted)
	}
	for _, cpu := range free[:n] {
		c.owner[cpu] = id
	}
	return free[:n], nil
}

// releaseLocked frees the cores of container id; it reports whether any.
func (c *cpuSets) releaseLocked(id string) bool {
	freed := false
	for cpu, owner := range c.owner {
		if owner == id {
			delete(c.owner, cpu)
			freed = true
		}
	}
	return freed
}

// sharedLocked is the shared pool: every CPU no container holds exclusively.
func (c *cpuSets) sharedLocked() []int {
	var out []int
	for _, cpu := range c.all {
		if _, taken := c.owner[cpu]; !taken {
			out = append(out, cpu)
		}
	}
	return out
}

// ownedLocked lists the exclusive cores of container id.
func (c *cpuSets) ownedLocked(id string) []int {
	var out []int
	for cpu, owner := range c.owner {
		if owner == id {
			out = append(out, cpu)
		}
	}
	slices.Sort(out)
	return out
}

// LabelExclusiveCPUs records a container's exclusive cores for recovery.
const LabelExclusiveCPUs = "sandman.io/exclusive-cpus"

func (c *cpuSets) exclusiveLocked(id string) bool {
	for _, owner := range c.owner {
		if owner == id {
			return true
		}
	}
	return false
}

// applyShared writes the shared pool to the cpuset of each listed container
// (the default spec's cgroupsPath, /<namespace>/<id>).
func applyShared(namespace string, ids []string, shared []int) error {
	list := formatCPUList(shared)
	var errs []string
	for _, id := range ids {
		var p string
		if cgroups.Mode() == cgroups.Unified {
			p = filepath.Join("/sys/fs/cgroup", namespace, id, "cpuset.cpus")
		} else {
			p = filepath.Join("/sys/fs/cgroup/cpuset", namespace, id, "cpuset.cpus")
		}
		if err := os.WriteFile(p, []byte(list), 0); err != nil && !os.IsNotExist(err) {
			errs = append(errs, err.Error())
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("update shared cpusets: %s", strings.Join(errs, "; "))
	}
	return nil
}

func parseCPUList(s string) ([]int, error) {
	var out []int
	if s == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(part, "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("bad CPU list %q", s)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("bad CPU list %q", s)
			}
		}
		for cpu := a; cpu <= b; cpu++ {
			out = append(out, cpu)
		}
	}
	return out, nil
}

func formatCPUList(cpus []int) string {
	parts := make([]string, len(cpus))
	for i, c := range cpus {
		parts[i] = strconv.Itoa(c)
	}
	return strings.Join(parts, ",")
}

// rebalanceCPUs gives every container that holds no exclusive core the
// current shared pool (after an exclusive allocation or release).
func (r *Runtime) rebalanceCPUs() {
	r.mu.Lock()
	shared := r.cpus.sharedLocked()
	var ids []string
	for _, s := range r.slots {
		for _, id := range s.containers {
			if !r.cpus.exclusiveLocked(id) {
				ids = append(ids, id)
			}
		}
	}
	r.mu.Unlock()
	if err := applyShared(r.cfg.Namespace, ids, shared); err != nil {
		r.log.Warn("rebalance shared CPUs", "err", err)
	}
}

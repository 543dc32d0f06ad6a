package noderuntime

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

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

func (c *cpuSets) exclusiveLocked(id string) bool {
	for _, owner := range c.owner {
		if owner == id {
			return true
		}
	}
	return false
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

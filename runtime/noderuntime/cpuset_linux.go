package noderuntime

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/containerd/cgroups/v3"
)

// newCPUSets reads the node's online CPUs; reserved (a CPU list) stay in
// the shared pool.
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

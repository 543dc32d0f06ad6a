package vk

import (
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"

	"github.com/sandman-dev/sandman/runtime"
)

// poolResources are the resources a pool gives defaults and maximums for.
var poolResources = []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage}

// checkPoolLimits checks the pool's default and maximum limits (Config).
func checkPoolLimits(def, ceiling corev1.ResourceList) error {
	for what, l := range map[string]corev1.ResourceList{"default": def, "maximum": ceiling} {
		for name, q := range l {
			if !slices.Contains(poolResources, name) {
				return fmt.Errorf("vk: %s limit for %s: pools bound only %v", what, name, poolResources)
			}
			if q.Sign() <= 0 {
				return fmt.Errorf("vk: %s limit for %s is %s: want a positive amount", what, name, q.String())
			}
		}
	}
	for name, d := range def {
		if m, ok := ceiling[name]; ok && d.Cmp(m) > 0 {
			return fmt.Errorf("vk: default %s limit %s is above the maximum %s", name, d.String(), m.String())
		}
	}
	return nil
}

// poolLimits applies the pool's limits to a container: a request or limit
// above the maximum is refused; a resource without a limit gets the
// default one (or its request, when that is larger); every container gets
// the pool's pids limit.
func (p *Provider) poolLimits(c corev1.Container, cs *runtime.ContainerSpec) error {
	for _, name := range poolResources {
		if ceiling, ok := p.cfg.MaxLimits[name]; ok {
			for _, asked := range []struct {
				what string
				l    corev1.ResourceList
			}{{"request", c.Resources.Requests}, {"limit", c.Resources.Limits}} {
				if q, ok := asked.l[name]; ok && q.Cmp(ceiling) > 0 {
					return fmt.Errorf("container %q: %s %s %s is above the maximum %s of pool %s: ask for at most that",
						c.Name, name, asked.what, q.String(), ceiling.String(), p.cfg.NodeName)
				}
			}
		}
		if q, ok := c.Resources.Limits[name]; ok && !q.IsZero() {
			continue
		}
		d, ok := p.cfg.DefaultLimits[name]
		if !ok {
			continue
		}
		switch name {
		case corev1.ResourceCPU:
			cs.Limits.MilliCPU = max(d.MilliValue(), cs.Requests.MilliCPU)
		case corev1.ResourceMemory:
			cs.Limits.MemoryBytes = max(d.Value(), cs.Requests.MemoryBytes)
		case corev1.ResourceEphemeralStorage:
			req := c.Resources.Requests[corev1.ResourceEphemeralStorage]
			cs.DiskBytes = max(d.Value(), req.Value())
		}
	}
	cs.PidsLimit = p.cfg.PidsLimit
	return nil
}

package vk

import (
	"cmp"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/sandman-dev/sandman/podcontract"
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

// Bandwidth is a sandbox's traffic cap each way, in bits per second (0:
// none), as podcontract.AnnotationIngressBandwidth and podcontract.AnnotationEgressBandwidth say it.
type Bandwidth struct {
	Ingress, Egress int64
}

// The caps the node agent takes (sandboxnet.SetBandwidth).
var (
	minBandwidth = resource.MustParse("1k")
	maxBandwidth = resource.MustParse("32G")
)

// checkPoolBandwidth checks the pool's default and maximum bandwidth
// (Config).
func checkPoolBandwidth(def, ceiling Bandwidth) error {
	for _, b := range []struct {
		what string
		v    int64
	}{
		{"default ingress", def.Ingress}, {"default egress", def.Egress},
		{"maximum ingress", ceiling.Ingress}, {"maximum egress", ceiling.Egress},
	} {
		if b.v != 0 && (b.v < minBandwidth.Value() || b.v > maxBandwidth.Value()) {
			return fmt.Errorf("vk: %s bandwidth %s: want bits per second from %s to %s, or none", b.what, bits(b.v), minBandwidth.String(), maxBandwidth.String())
		}
	}
	if def.Ingress > 0 && ceiling.Ingress > 0 && def.Ingress > ceiling.Ingress {
		return fmt.Errorf("vk: default ingress bandwidth %s is above the maximum %s", bits(def.Ingress), bits(ceiling.Ingress))
	}
	if def.Egress > 0 && ceiling.Egress > 0 && def.Egress > ceiling.Egress {
		return fmt.Errorf("vk: default egress bandwidth %s is above the maximum %s", bits(def.Egress), bits(ceiling.Egress))
	}
	return nil
}

// poolBandwidth sets the sandbox's caps from the pod's bandwidth
// annotations within the pool's maximum, or to the pool's default (its
// maximum when it has no default) where the pod sets none, so the maximum
// bounds every sandbox.
func (p *Provider) poolBandwidth(pod *corev1.Pod, req *runtime.BindRequest) error {
	for _, bw := range []struct {
		key          string
		to           *int64
		def, ceiling int64
	}{
		{podcontract.AnnotationIngressBandwidth, &req.IngressBandwidth, p.cfg.DefaultBandwidth.Ingress, p.cfg.MaxBandwidth.Ingress},
		{podcontract.AnnotationEgressBandwidth, &req.EgressBandwidth, p.cfg.DefaultBandwidth.Egress, p.cfg.MaxBandwidth.Egress},
	} {
		v, ok := pod.Annotations[bw.key]
		if !ok {
			*bw.to = cmp.Or(bw.def, bw.ceiling)
			continue
		}
		q, err := resource.ParseQuantity(v)
		if err != nil || q.Cmp(minBandwidth) < 0 || q.Cmp(maxBandwidth) > 0 {
			return fmt.Errorf("annotation %s: %q: want bits per second from %s to %s, such as 10M", bw.key, v, minBandwidth.String(), maxBandwidth.String())
		}
		if bw.ceiling > 0 && q.Value() > bw.ceiling {
			return fmt.Errorf("annotation %s: %s is above the maximum %s of pool %s: ask for at most that", bw.key, q.String(), bits(bw.ceiling), p.poolName())
		}
		*bw.to = q.Value()
	}
	return nil
}

// bits is a bits-per-second figure as the annotations write it (100M).
func bits(v int64) string { return resource.NewQuantity(v, resource.DecimalSI).String() }

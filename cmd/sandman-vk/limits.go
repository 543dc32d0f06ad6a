package main

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/sandman-dev/sandman/vk"
)

// Pool limits unless flags say otherwise (docs/install.md says why these).
const (
	defaultLimits = "cpu=1,memory=1Gi,ephemeral-storage=10Gi"
	maxLimits     = "cpu=4,memory=8Gi,ephemeral-storage=50Gi"
)

// resourceList is a flag of resource=quantity pairs (cpu=1,memory=1Gi,
// ephemeral-storage=10Gi); an empty value means none.
type resourceList struct{ l corev1.ResourceList }

func (r *resourceList) String() string {
	if r == nil {
		return ""
	}
	var parts []string
	for name, q := range r.l {
		parts = append(parts, string(name)+"="+q.String())
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

func (r *resourceList) Set(v string) error {
	l := corev1.ResourceList{}
	for kv := range strings.SplitSeq(v, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		name, val, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("%q: want resource=quantity (cpu=1,memory=1Gi,ephemeral-storage=10Gi)", kv)
		}
		switch n := corev1.ResourceName(strings.TrimSpace(name)); n {
		case corev1.ResourceCPU, corev1.ResourceMemory, corev1.ResourceEphemeralStorage:
			q, err := resource.ParseQuantity(strings.TrimSpace(val))
			if err != nil {
				return fmt.Errorf("%s: %w", n, err)
			}
			l[n] = q
		default:
			return fmt.Errorf("%q: want cpu, memory or ephemeral-storage", name)
		}
	}
	r.l = l
	return nil
}

func mustResourceList(v string) resourceList {
	var r resourceList
	if err := r.Set(v); err != nil {
		panic(err)
	}
	return r
}

// bandwidth is a flag of a sandbox's traffic caps each way in bits per
// second (ingress=100M,egress=100M; either may be left out); an empty
// value means none.
type bandwidth struct{ b vk.Bandwidth }

func (f *bandwidth) String() string {
	if f == nil {
		return ""
	}
	var parts []string
	for _, d := range []struct {
		name string
		v    int64
	}{{"ingress", f.b.Ingress}, {"egress", f.b.Egress}} {
		if d.v > 0 {
			parts = append(parts, d.name+"="+resource.NewQuantity(d.v, resource.DecimalSI).String())
		}
	}
	return strings.Join(parts, ",")
}

func (f *bandwidth) Set(v string) error {
	var b vk.Bandwidth
	for kv := range strings.SplitSeq(v, ",") {
		if kv = strings.TrimSpace(kv); kv == "" {
			continue
		}
		name, val, ok := strings.Cut(kv, "=")
		if !ok {
			return fmt.Errorf("%q: want ingress=bits/s,egress=bits/s (ingress=100M,egress=100M)", kv)
		}
		q, err := resource.ParseQuantity(strings.TrimSpace(val))
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		switch strings.TrimSpace(name) {
		case "ingress":
			b.Ingress = q.Value()
		case "egress":
			b.Egress = q.Value()
		default:
			return fmt.Errorf("%q: want ingress or egress", name)
		}
	}
	f.b = b
	return nil
}

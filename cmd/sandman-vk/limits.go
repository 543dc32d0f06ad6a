package main

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
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

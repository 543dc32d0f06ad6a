package main

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestResourceListFlag(t *testing.T) {
	var r resourceList
	if err := r.Set("cpu=500m, memory=1Gi,ephemeral-storage=10Gi"); err != nil {
		t.Fatal(err)
	}
	if q := r.l[corev1.ResourceCPU]; q.MilliValue() != 500 {
		t.Fatalf("cpu %s", q.String())
	}
	if got := r.String(); got != "cpu=500m,ephemeral-storage=10Gi,memory=1Gi" {
		t.Fatalf("String() = %q", got)
	}
	if err := r.Set(""); err != nil || len(r.l) != 0 {
		t.Fatalf("empty: %v %v", r.l, err)
	}
	for _, bad := range []string{"cpu", "pods=10", "memory=lots"} {
		if err := r.Set(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	// The built-in defaults parse, and the default fits under the maximum.
	d, m := mustResourceList(defaultLimits), mustResourceList(maxLimits)
	for name, q := range d.l {
		if mq, ok := m.l[name]; !ok || q.Cmp(mq) > 0 {
			t.Errorf("default %s %s above the maximum %s", name, q.String(), mq.String())
		}
	}
}

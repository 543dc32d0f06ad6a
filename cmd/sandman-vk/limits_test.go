package main

import (
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/sandman-dev/sandman/vk"
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

func TestBandwidthFlag(t *testing.T) {
	for _, tc := range []struct {
		in, str string
		want    vk.Bandwidth
	}{
		{"", "", vk.Bandwidth{}},
		{"ingress=100M, egress=1G", "ingress=100M,egress=1G", vk.Bandwidth{Ingress: 100e6, Egress: 1e9}},
		{"egress=10M", "egress=10M", vk.Bandwidth{Egress: 10e6}},
	} {
		var f bandwidth
		if err := f.Set(tc.in); err != nil {
			t.Fatalf("%q: %v", tc.in, err)
		}
		if f.b != tc.want || f.String() != tc.str {
			t.Errorf("%q: %+v %q, want %+v %q", tc.in, f.b, f.String(), tc.want, tc.str)
		}
	}
	for _, bad := range []string{"ingress", "up=10M", "egress=lots"} {
		var f bandwidth
		if err := f.Set(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

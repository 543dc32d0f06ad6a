package noderuntime

import (
	"slices"
	"testing"

	"github.com/containerd/errdefs"
)

func TestCPUList(t *testing.T) {
	for in, want := range map[string][]int{"": nil, "0": {0}, "0-3": {0, 1, 2, 3}, "0,2-3,7": {0, 2, 3, 7}} {
		got, err := parseCPUList(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("parseCPUList(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, bad := range []string{"a", "3-1", "1-", ",", "1,,2"} {
		if _, err := parseCPUList(bad); err == nil {
			t.Errorf("parseCPUList(%q): want an error", bad)
		}
	}
	if got := formatCPUList([]int{1, 2, 5}); got != "1,2,5" {
		t.Errorf("formatCPUList = %q", got)
	}
}

func TestCPUSetsAllocate(t *testing.T) {
	c := &cpuSets{all: []int{0, 1, 2, 3}, reserved: []int{0}, owner: map[int]string{}}
	a, err := c.allocateLocked("a", 2)
	if err != nil || !slices.Equal(a, []int{1, 2}) {
		t.Fatalf("allocate a: %v %v", a, err)
	}
	if got := c.sharedLocked(); !slices.Equal(got, []int{0, 3}) {
		t.Fatalf("shared pool %v, want [0 3]", got)
	}
	if _, err := c.allocateLocked("b", 2); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("allocate past the free cores: %v", err)
	}
	if !c.exclusiveLocked("a") || c.exclusiveLocked("b") {
		t.Fatal("exclusive owners wrong")
	}
	if !c.releaseLocked("a") || c.releaseLocked("a") {
		t.Fatal("release a: want freed once")
	}
	if got := c.sharedLocked(); !slices.Equal(got, []int{0, 1, 2, 3}) {
		t.Fatalf("shared pool after release %v", got)
	}
}

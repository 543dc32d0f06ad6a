package framework

import (
	"slices"
	"testing"
)

func TestCensusLeaks(t *testing.T) {
	before := &Census{
		Namespaces: []string{"sandman-local", "sandman-e2e-w0-old"},
		Containers: []string{"sandman-local/slot-1", "k8s.io/pause-a"},
		Tasks:      []string{"sandman-local/slot-1"},
		Mounts:     []string{"/", "/var/lib/sandman-local/e2e-nodes/w0-old/netns/a"},
		Shims:      []string{"10 sandman-local/slot-1"},
	}
	after := &Census{
		Namespaces: []string{"sandman-local", "sandman-e2e-w0-old", "sandman-e2e-w1-new", "other-new"},
		Containers: []string{
			"sandman-local/slot-2",      // a developer's pool recycled a slot: not counted
			"k8s.io/pause-a",            // was there before
			"sandman-e2e-w1-new/slot-9", // left by a test
			"other-new/x",               // a namespace the tests made
		},
		Tasks: []string{"sandman-local/slot-2", "sandman-e2e-w1-new/slot-9"},
		Mounts: []string{"/", "/var/lib/sandman-local/e2e-nodes/w0-old/netns/a",
			"/var/lib/sandman-local/e2e-nodes/w1-new/netns/b",
			"/run/sandman/containerd/io.containerd.runtime.v2.task/sandman-e2e-w1-new/slot-9/rootfs",
			"/run/sandman/containerd/io.containerd.runtime.v2.task/sandman-local/slot-2/rootfs",
			"/mnt/unrelated"},
		Shims: []string{"10 sandman-local/slot-1", "11 sandman-local/slot-2", "12 sandman-e2e-w1-new/slot-9"},
	}
	got := before.Leaks(after)
	want := []string{
		"container sandman-e2e-w1-new/slot-9",
		"container other-new/x",
		"task sandman-e2e-w1-new/slot-9",
		"mount /var/lib/sandman-local/e2e-nodes/w1-new/netns/b",
		"mount /run/sandman/containerd/io.containerd.runtime.v2.task/sandman-e2e-w1-new/slot-9/rootfs",
		"shim 12 sandman-e2e-w1-new/slot-9",
	}
	if !slices.Equal(got, want) {
		t.Errorf("leaks:\n got %q\nwant %q", got, want)
	}
	if l := before.Leaks(before); len(l) != 0 {
		t.Errorf("a census leaks against itself: %q", l)
	}
}

func TestCensusHolding(t *testing.T) {
	c := &Census{
		Containers: []string{"sandman-e2e-w1-a/slot-1", "sandman-e2e-w1-ab/slot-2", "sandman-local/slot-3"},
		Tasks:      []string{"sandman-e2e-w1-a/slot-1", "sandman-e2e-w1-ab/slot-2"},
		Mounts: []string{"/", "/state/e2e-nodes/w1-a/netns/x", "/state/e2e-nodes/w1-ab/netns/y",
			"/run/containerd/io.containerd.runtime.v2.task/sandman-e2e-w1-a/slot-1/rootfs",
			"/run/containerd/io.containerd.runtime.v2.task/sandman-e2e-w1-ab/slot-2/rootfs"},
		Shims: []string{"7 sandman-e2e-w1-a/holder-1", "8 sandman-e2e-w1-ab/holder-2"},
	}
	got := c.Holding("sandman-e2e-w1-a", "/state/e2e-nodes/w1-a/")
	want := []string{
		"container sandman-e2e-w1-a/slot-1",
		"task sandman-e2e-w1-a/slot-1",
		"mount /state/e2e-nodes/w1-a/netns/x",
		"mount /run/containerd/io.containerd.runtime.v2.task/sandman-e2e-w1-a/slot-1/rootfs",
		"shim 7 sandman-e2e-w1-a/holder-1",
	}
	if !slices.Equal(got, want) {
		t.Errorf("holding:\n got %q\nwant %q", got, want)
	}
	if h := c.Holding("sandman-e2e-w9-none", "/state/e2e-nodes/w9-none"); len(h) != 0 {
		t.Errorf("holding of an unknown namespace: %q", h)
	}
}

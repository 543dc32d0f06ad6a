package main

import (
	"strings"
	"testing"
)

// TestVersionFlag: --version answers before the flags are checked, with
// no credentials or cluster.
func TestVersionFlag(t *testing.T) {
	if err := run([]string{"--version"}); err != nil {
		t.Fatalf("run(--version): %v", err)
	}
}

// TestLazyPullNeedsALazySnapshotter: --lazy-pull with containerd's own
// overlayfs is refused at start, naming what it needs.
func TestLazyPullNeedsALazySnapshotter(t *testing.T) {
	err := run([]string{"--lazy-pull"})
	if err == nil || !strings.Contains(err.Error(), "--snapshotter stargz") {
		t.Fatalf("run(--lazy-pull): %v, want a refusal naming --snapshotter stargz", err)
	}
}

// TestLazyConvertNeedsLazyPull: a convert repository without lazy pulls is
// refused at start: conversions nobody mounts lazily would only cost.
func TestLazyConvertNeedsLazyPull(t *testing.T) {
	err := run([]string{"--lazy-convert-repository", "registry.example/lazy"})
	if err == nil || !strings.Contains(err.Error(), "needs --lazy-pull") {
		t.Fatalf("run(--lazy-convert-repository): %v, want a refusal naming --lazy-pull", err)
	}
}

package main

import (
	"runtime/debug"
	"testing"
)

func TestKubeletVersionOf(t *testing.T) {
	for _, tc := range []struct {
		name string
		bi   *debug.BuildInfo
		want string
	}{
		{"no build info", nil, "v0.0.0-sandman"},
		{"no client-go", &debug.BuildInfo{Deps: []*debug.Module{{Path: "k8s.io/api", Version: "v0.37.2"}}}, "v0.0.0-sandman"},
		{"client-go", &debug.BuildInfo{Deps: []*debug.Module{{Path: "k8s.io/api", Version: "v0.1.0"}, {Path: "k8s.io/client-go", Version: "v0.37.2"}}}, "v1.37.2-sandman"},
		{"pre-release", &debug.BuildInfo{Deps: []*debug.Module{{Path: "k8s.io/client-go", Version: "v0.38.0-rc.1"}}}, "v1.38.0-sandman"},
		{"replaced", &debug.BuildInfo{Deps: []*debug.Module{{Path: "k8s.io/client-go", Version: "v0.37.2", Replace: &debug.Module{Path: "k8s.io/client-go", Version: "v0.37.3"}}}}, "v1.37.3-sandman"},
		{"not v0", &debug.BuildInfo{Deps: []*debug.Module{{Path: "k8s.io/client-go", Version: "v12.0.0+incompatible"}}}, "v0.0.0-sandman"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := kubeletVersionOf(tc.bi); got != tc.want {
				t.Errorf("kubeletVersionOf = %q, want %q", got, tc.want)
			}
		})
	}
	// The binary under test is built with the pinned client-go.
	if got := kubeletVersion(); got == "v0.0.0-sandman" {
		t.Errorf("kubeletVersion of this build = %q: no k8s.io/client-go in its build info", got)
	}
}

// TestVersionFlag: --version answers before the flags are checked, with
// no credentials or cluster.
func TestVersionFlag(t *testing.T) {
	if err := run([]string{"--version"}); err != nil {
		t.Fatalf("run(--version): %v", err)
	}
}

package main

import (
	"regexp"
	"strings"
	"testing"

	"github.com/sandman-dev/sandman/internal/depstest"
)

// TestLinksNoServer: the CLI reads the virtual node's wire types from vk/api
// and the daemon's from daemon/api, and links none of the servers behind
// them (the provider, the pool, virtual-kubelet, the daemon server).
func TestLinksNoServer(t *testing.T) {
	forbidden := regexp.MustCompile(`^(github\.com/virtual-kubelet/virtual-kubelet(/.*)?|github\.com/sandman-dev/sandman/(vk|pool|daemon|runtime/noderuntime|runtime/nodeapi))$`)
	var bad []string
	for _, pkg := range depstest.NonStandard(t) {
		if forbidden.MatchString(pkg) {
			bad = append(bad, pkg)
		}
	}
	if len(bad) > 0 {
		t.Errorf("sandmanctl links %s; wire types belong in their own small package (vk/api, daemon/api)", strings.Join(bad, ", "))
	}
}

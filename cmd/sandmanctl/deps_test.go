package main

import (
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// TestLinksNoServer: the CLI reads the virtual node's wire types from vk/api
// and the daemon's from daemon/api, and links none of the servers behind
// them (the provider, the pool, virtual-kubelet, the daemon server).
func TestLinksNoServer(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command in PATH to list sandmanctl's dependencies")
	}
	out, err := exec.Command(goTool, "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	forbidden := regexp.MustCompile(`^(github\.com/virtual-kubelet/virtual-kubelet(/.*)?|github\.com/sandman-dev/sandman/(vk|pool|daemon|runtime/noderuntime|runtime/nodeapi))$`)
	var bad []string
	for _, pkg := range strings.Fields(string(out)) {
		if forbidden.MatchString(pkg) {
			bad = append(bad, pkg)
		}
	}
	if len(bad) > 0 {
		t.Errorf("sandmanctl links %s; wire types belong in their own small package (vk/api, daemon/api)", strings.Join(bad, ", "))
	}
}

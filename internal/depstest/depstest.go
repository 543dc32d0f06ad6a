// Package depstest lists what a package links, for the tests that keep
// sandman's import rules (a leaf stays a leaf, a client links no server).
package depstest

import (
	"os/exec"
	"strings"
	"testing"
)

// NonStandard is every package outside the standard library that the
// package in the test's directory links (`go list -deps`), itself
// included. Without a go command in PATH the test is skipped.
func NonStandard(t testing.TB) []string {
	t.Helper()
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command in PATH to list the package's dependencies")
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	return strings.Fields(string(out))
}

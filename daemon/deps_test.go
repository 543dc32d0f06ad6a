package daemon_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsOnlyDaemon: the daemon runs inside every sandbox's image as a
// static binary; it links no sandman package outside daemon/.
func TestImportsOnlyDaemon(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command in PATH to list the package's dependencies")
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	const module = "github.com/sandman-dev/sandman/"
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, module) && pkg != module+"daemon" && !strings.HasPrefix(pkg, module+"daemon/") {
			t.Errorf("the daemon depends on %s: keep it to daemon/ and its own small dependencies", pkg)
		}
	}
}

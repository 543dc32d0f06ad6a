package daemon_test

import (
	"strings"
	"testing"

	"github.com/sandman-dev/sandman/internal/depstest"
)

// TestImportsOnlyDaemon: the daemon runs inside every sandbox's image as a
// static binary; it links no sandman package outside daemon/.
func TestImportsOnlyDaemon(t *testing.T) {
	const module = "github.com/sandman-dev/sandman/"
	for _, pkg := range depstest.NonStandard(t) {
		if strings.HasPrefix(pkg, module) && pkg != module+"daemon" && !strings.HasPrefix(pkg, module+"daemon/") {
			t.Errorf("the daemon depends on %s: keep it to daemon/ and its own small dependencies", pkg)
		}
	}
}

//go:build root

package sandboxuser

import (
	"testing"

	"github.com/sandman-dev/sandman/daemon/internal/gvisortest"
)

// TestRootAsUserGVisor runs the credential and hand-over tests inside a
// gVisor sandbox: gVisor has no setfsuid, and checks files against the
// thread's effective ids alone.
func TestRootAsUserGVisor(t *testing.T) {
	gvisortest.Rerun(t, "TestAsUser", "TestMkdirAllOwn", "TestMkdirAllHandOver", "TestHandOverLeavesWhatIsThere")
}

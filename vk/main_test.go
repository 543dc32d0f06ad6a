package vk

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if a goroutine they started outlives
// them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// opencensus's view worker, started by the package's init when
		// virtual-kubelet's node/api imports ochttp: it runs for the life
		// of the process and nothing can stop it.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
	)
}

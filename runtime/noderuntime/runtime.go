package noderuntime

import "github.com/sandman-dev/sandman/runtime"

// Runtime offers the same API on every OS: on Linux the implementation
// (runtime_linux.go and a file per verb beside it), elsewhere a Runtime
// that New refuses to make (runtime_other.go), so the packages that use it
// build, vet and test off Linux too.
var (
	_ runtime.Runtime      = (*Runtime)(nil)
	_ runtime.Drainer      = (*Runtime)(nil)
	_ runtime.ImageCache   = (*Runtime)(nil)
	_ runtime.Snapshotter  = (*Runtime)(nil)
	_ runtime.Checkpointer = (*Runtime)(nil)
	_ runtime.EgressSetter = (*Runtime)(nil)
)

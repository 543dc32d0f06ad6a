//go:build !linux

package hostexec

import (
	"errors"
	"strings"
	"testing"
)

// TestSetupNeedsLinux: off Linux Setup makes no shims and says it needs
// Linux, as an error that wraps errors.ErrUnsupported.
func TestSetupNeedsLinux(t *testing.T) {
	dir, err := Setup(Config{HostRoot: "/host", CNIBinDir: "/opt/cni/bin", ShimDir: t.TempDir()})
	if dir != "" || !errors.Is(err, errors.ErrUnsupported) || !strings.Contains(err.Error(), "needs Linux") {
		t.Errorf("Setup = (%q, %v), want no directory and a needs-Linux error wrapping errors.ErrUnsupported", dir, err)
	}
	Main() // returns: no shim started this process
}

//go:build !linux

package hostexec

import (
	"errors"
	"fmt"
)

// errNeedsLinux is Setup's answer off Linux: the shims chroot into the
// host's root and enter network namespaces, which only Linux has.
var errNeedsLinux = fmt.Errorf("hostexec: running the host's CNI plugins and iptables from a container needs Linux; run sandman-node on a Linux worker: %w", errors.ErrUnsupported)

// Setup refuses off Linux with an error that wraps errors.ErrUnsupported.
func Setup(cfg Config) (cniDir string, err error) {
	return "", errNeedsLinux
}

// Main returns at once off Linux: Setup makes no shims there, so this
// process was not started through one.
func Main() {}

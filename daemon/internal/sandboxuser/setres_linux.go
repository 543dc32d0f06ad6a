//go:build linux && !386 && !arm

package sandboxuser

import "golang.org/x/sys/unix"

// The set-ids calls with 32-bit ids.
const (
	sysSetresuid = unix.SYS_SETRESUID
	sysSetresgid = unix.SYS_SETRESGID
)

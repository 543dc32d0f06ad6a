//go:build linux && (386 || arm)

package sandboxuser

import "golang.org/x/sys/unix"

// The set-ids calls with 32-bit ids (SYS_SETRESUID takes 16-bit ones on
// these architectures).
const (
	sysSetresuid = unix.SYS_SETRESUID32
	sysSetresgid = unix.SYS_SETRESGID32
)

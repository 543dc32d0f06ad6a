//go:build unix

package archive

import "syscall"

// readFlags open a file to archive without blocking should it have become
// a FIFO since the walk saw it.
const readFlags = syscall.O_NONBLOCK

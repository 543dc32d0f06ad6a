// Package oserr sorts the operating system's errors into a few classes,
// once, for every protocol the daemon speaks: the v1 API, envd's Connect
// services and envd's REST paths each turn a class into their own status
// at their edge, so that the same failure reads the same in all three.
package oserr

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os/exec"
	"syscall"
)

// Class is what kind of failure an error of the OS is.
type Class int

const (
	// Other is none of the classes below: the daemon's own failure.
	Other Class = iota
	// NotFound: ENOENT, or an executable not in PATH.
	NotFound
	// Permission: EACCES, EPERM, EROFS.
	Permission
	// NotADirectory: ENOTDIR.
	NotADirectory
	// IsADirectory: EISDIR.
	IsADirectory
	// Exists: EEXIST.
	Exists
	// NotEmpty: ENOTEMPTY.
	NotEmpty
	// CrossDevice: EXDEV.
	CrossDevice
	// Busy: EBUSY.
	Busy
	// Invalid: EINVAL, ENAMETOOLONG.
	Invalid
	// Loop: ELOOP.
	Loop
	// NoSpace: ENOSPC, EDQUOT (the sandbox's disk is full).
	NoSpace
	// Exhausted: EAGAIN, ENOMEM (the sandbox's process or memory limit; a
	// fork under a pids limit fails with EAGAIN).
	Exhausted
)

// Of is err's class.
func Of(err error) Class {
	switch {
	case err == nil:
		return Other
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, exec.ErrNotFound):
		return NotFound
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		return Permission
	case errors.Is(err, syscall.ENOTDIR):
		return NotADirectory
	case errors.Is(err, syscall.EISDIR):
		return IsADirectory
	// Before Exists: fs.ErrExist matches ENOTEMPTY too.
	case errors.Is(err, syscall.ENOTEMPTY):
		return NotEmpty
	case errors.Is(err, fs.ErrExist):
		return Exists
	case errors.Is(err, syscall.EXDEV):
		return CrossDevice
	case errors.Is(err, syscall.EBUSY):
		return Busy
	case errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.EINVAL):
		return Invalid
	case errors.Is(err, syscall.ELOOP):
		return Loop
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		return NoSpace
	case errors.Is(err, syscall.EAGAIN), errors.Is(err, syscall.ENOMEM):
		return Exhausted
	}
	return Other
}

// HTTPStatus is the class's HTTP status, for the v1 API and envd's REST
// paths alike.
func (c Class) HTTPStatus() int {
	switch c {
	case NotFound:
		return http.StatusNotFound
	case Permission:
		return http.StatusForbidden
	case NotADirectory, IsADirectory, Invalid, Loop:
		return http.StatusBadRequest
	case Exists, NotEmpty:
		return http.StatusConflict
	case NoSpace:
		return http.StatusInsufficientStorage
	case Exhausted:
		return http.StatusTooManyRequests
	}
	return http.StatusInternalServerError
}

// Limit says which of the sandbox's limits an error of the class ran into
// ("" for none), for messages: "the sandbox's disk is full".
func (c Class) Limit() string {
	switch c {
	case NoSpace:
		return "the sandbox's disk is full"
	case Exhausted:
		return "the sandbox's process or memory limit"
	}
	return ""
}

// Explain adds what to do to the errors whose bare text does not say.
func Explain(err error) error {
	switch Of(err) {
	case NotADirectory:
		return fmt.Errorf("%w: a component of the path is a file, not a directory", err)
	case CrossDevice:
		return fmt.Errorf("%w: source and destination are on different filesystems; copy and remove instead", err)
	case Loop:
		return fmt.Errorf("%w: too many symbolic links (a loop?)", err)
	}
	return err
}

package sandboxuser

import (
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"syscall"

	"golang.org/x/sys/unix"
)

// fsCred is who the kernel checks a file operation against: a user's
// filesystem uid and gid and supplementary groups.
type fsCred struct {
	uid, gid int
	groups   []int
}

// ErrCannotActAs: the daemon cannot take a user's credentials (it is not
// root), so it does not act for them.
var ErrCannotActAs = fmt.Errorf("cannot act as another user: %w", fs.ErrPermission)

// asUser runs fn with c's credentials, so the kernel checks every
// permission fn needs against c, as it would for a process of c's, and
// what fn creates is c's. The daemon's own credentials (c is nil, or c's
// ids are the daemon's) run fn as it is; a daemon that is not root cannot
// become anyone else and refuses with ErrCannotActAs.
//
// fn runs on a goroutine of its own, locked to an OS thread whose
// fsuid, fsgid and supplementary groups alone are switched, with raw
// per-thread system calls (setgroups, setfsgid, setfsuid): the Go
// runtime's Setuid and friends change every thread of the daemon at once.
// A thread whose fsuid leaves 0 loses CAP_DAC_OVERRIDE,
// CAP_DAC_READ_SEARCH, CAP_FOWNER and the other filesystem capabilities
// from its effective set, and gets them back when it returns to 0, so
// root's overrides do not reach fn. The thread goes back to the runtime
// only once its credentials are restored; if they cannot be, it stays
// locked and ends with the goroutine. fn must do its file work on the
// calling goroutine (another one would run on another thread) and should
// not wait on the network: it holds a thread.
func asUser(c *fsCred, fn func() error) error {
	euid, egid := os.Geteuid(), os.Getegid()
	if c == nil || (c.uid == euid && c.gid == egid) {
		return fn()
	}
	if euid != 0 {
		return fmt.Errorf("%w: uid %d, while the daemon runs as uid %d, not root: name no user, or the daemon's own", ErrCannotActAs, c.uid, euid)
	}
	type result struct {
		err      error
		panicked any
	}
	done := make(chan result, 1)
	go func() {
		runtime.LockOSThread()
		var res result
		defer func() { done <- res }()
		saved, err := threadFSCred()
		if err != nil {
			runtime.UnlockOSThread() // nothing changed yet
			res.err = err
			return
		}
		if err := setThreadFSCred(*c); err != nil {
			res.err = fmt.Errorf("take uid %d, gid %d and the user's groups for a file operation: %w", c.uid, c.gid, err)
			if setThreadFSCred(saved) == nil {
				runtime.UnlockOSThread()
			}
			return
		}
		func() {
			defer func() { res.panicked = recover() }()
			res.err = fn()
		}()
		if setThreadFSCred(saved) == nil {
			runtime.UnlockOSThread()
		}
	}()
	res := <-done
	if res.panicked != nil {
		panic(res.panicked)
	}
	return res.err
}

// threadFSCred reads the calling thread's filesystem credentials.
func threadFSCred() (fsCred, error) {
	uid, _ := unix.SetfsuidRetUid(-1) // an invalid id changes nothing and returns the current one
	gid, _ := unix.SetfsgidRetGid(-1)
	groups, err := unix.Getgroups()
	if err != nil {
		return fsCred{}, fmt.Errorf("read the daemon's groups: %w", err)
	}
	return fsCred{uid: uid, gid: gid, groups: groups}, nil
}

// setThreadFSCred gives the calling thread c's filesystem credentials.
// CAP_SETUID and CAP_SETGID are not filesystem capabilities, so a root
// thread keeps them whatever its fsuid, and can switch back.
func setThreadFSCred(c fsCred) error {
	if err := unix.Setgroups(c.groups); err != nil {
		return fmt.Errorf("setgroups %v: %w", c.groups, err)
	}
	// setfsgid and setfsuid return the previous id, never an error: read
	// each back.
	_, _ = unix.SetfsgidRetGid(c.gid)
	if got, _ := unix.SetfsgidRetGid(-1); got != c.gid {
		return fmt.Errorf("setfsgid %d: still %d: %w", c.gid, got, syscall.EPERM)
	}
	_, _ = unix.SetfsuidRetUid(c.uid)
	if got, _ := unix.SetfsuidRetUid(-1); got != c.uid {
		return fmt.Errorf("setfsuid %d: still %d: %w", c.uid, got, syscall.EPERM)
	}
	return nil
}

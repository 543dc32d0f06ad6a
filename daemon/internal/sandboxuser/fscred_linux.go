package sandboxuser

import (
	"fmt"
	"io/fs"
	"os"
	"runtime"
	"slices"

	"golang.org/x/sys/unix"
)

// fsCred is who the kernel checks a file operation against: a user's uid
// and gid and supplementary groups.
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
// effective uid and gid and supplementary groups alone are switched, with
// raw per-thread system calls (setgroups, setresgid, setresuid): the Go
// runtime's Setuid and friends change every thread of the daemon at once.
// The effective ids, not the filesystem ones (setfsuid), because gVisor
// has no setfsuid or setfsgid (ENOSYS): it checks files against the
// effective ids, and Linux's filesystem ids follow them. The real and
// saved uid stay root's: other processes of the user can neither signal
// nor trace the daemon, and the thread can take uid 0 back. A thread whose
// effective uid leaves 0 has no effective capabilities, CAP_DAC_OVERRIDE,
// CAP_DAC_READ_SEARCH and CAP_FOWNER among them (cleared here if the
// kernel's securebits kept them), so root's overrides do not reach fn.
// The thread goes back to the runtime only once its credentials read back
// as they were; if they cannot be restored, it stays locked and ends with
// the goroutine. fn must do its file work on the calling goroutine
// (another one would run on another thread) and should not wait on the
// network: it holds a thread. Inside fn, os.Geteuid and os.Getegid answer
// c's ids: ask for the daemon's own before.
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
		saved, err := readThreadCred()
		if err != nil {
			runtime.UnlockOSThread() // nothing changed yet
			res.err = err
			return
		}
		if err := take(*c); err != nil {
			res.err = fmt.Errorf("take uid %d, gid %d and the user's groups for a file operation: %w", c.uid, c.gid, err)
			if restore(saved) == nil {
				runtime.UnlockOSThread()
			}
			return
		}
		func() {
			defer func() { res.panicked = recover() }()
			res.err = fn()
		}()
		if restore(saved) == nil {
			runtime.UnlockOSThread()
		}
	}()
	res := <-done
	if res.panicked != nil {
		panic(res.panicked)
	}
	return res.err
}

// threadCred is the calling thread's credentials as the kernel keeps them.
type threadCred struct {
	ruid, euid, suid int
	rgid, egid, sgid int
	groups           []int // sorted
	caps             [2]unix.CapUserData
}

func (a threadCred) equal(b threadCred) bool {
	return a.ruid == b.ruid && a.euid == b.euid && a.suid == b.suid &&
		a.rgid == b.rgid && a.egid == b.egid && a.sgid == b.sgid &&
		slices.Equal(a.groups, b.groups) && a.caps == b.caps
}

// readThreadCred reads the calling thread's credentials (getresuid,
// getresgid, getgroups and capget all answer for the calling thread).
func readThreadCred() (threadCred, error) {
	var c threadCred
	c.ruid, c.euid, c.suid = unix.Getresuid()
	c.rgid, c.egid, c.sgid = unix.Getresgid()
	groups, err := unix.Getgroups()
	if err != nil {
		return threadCred{}, fmt.Errorf("read the thread's groups: %w", err)
	}
	slices.Sort(groups)
	c.groups = groups
	if err := unix.Capget(capHeader(), &c.caps[0]); err != nil {
		return threadCred{}, fmt.Errorf("read the thread's capabilities: %w", err)
	}
	return c, nil
}

// capHeader asks capget and capset for the calling thread's 64-bit sets.
func capHeader() *unix.CapUserHeader {
	return &unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
}

// take gives the calling thread, root's, c's groups and effective gid and
// uid, in that order: setgroups and setresgid need CAP_SETGID, which the
// thread has only while its effective uid is 0.
func take(c fsCred) error {
	if err := unix.Setgroups(c.groups); err != nil {
		return fmt.Errorf("setgroups %v: %w", c.groups, err)
	}
	if err := setresgid(-1, c.gid, -1); err != nil {
		return fmt.Errorf("setresgid -1 %d -1: %w", c.gid, err)
	}
	if err := setresuid(-1, c.uid, -1); err != nil {
		return fmt.Errorf("setresuid -1 %d -1: %w", c.uid, err)
	}
	if c.uid == 0 {
		return nil // root by another gid keeps root's capabilities, as a process of root's would
	}
	var caps [2]unix.CapUserData
	if err := unix.Capget(capHeader(), &caps[0]); err != nil {
		return fmt.Errorf("read the thread's capabilities: %w", err)
	}
	if caps[0].Effective != 0 || caps[1].Effective != 0 {
		// The securebits (SECBIT_NO_SETUID_FIXUP) kept them: drop them
		// from the effective set; the permitted set still holds them for
		// restore.
		caps[0].Effective, caps[1].Effective = 0, 0
		if err := unix.Capset(capHeader(), &caps[0]); err != nil {
			return fmt.Errorf("drop the effective capabilities: %w", err)
		}
	}
	return nil
}

// restore gives the calling thread back saved, its credentials before
// take, and checks that they read back so. Uid 0 first: it makes the
// permitted capabilities effective again (capset sets them exactly as
// they were), which the gid and groups need.
func restore(saved threadCred) error {
	if err := setresuid(-1, saved.euid, -1); err != nil {
		return fmt.Errorf("setresuid -1 %d -1: %w", saved.euid, err)
	}
	caps := saved.caps
	if err := unix.Capset(capHeader(), &caps[0]); err != nil {
		return fmt.Errorf("restore the capabilities: %w", err)
	}
	if err := setresgid(-1, saved.egid, -1); err != nil {
		return fmt.Errorf("setresgid -1 %d -1: %w", saved.egid, err)
	}
	if err := unix.Setgroups(saved.groups); err != nil {
		return fmt.Errorf("setgroups %v: %w", saved.groups, err)
	}
	got, err := readThreadCred()
	if err != nil {
		return err
	}
	if !got.equal(saved) {
		return fmt.Errorf("the thread's credentials are %+v after restoring %+v", got, saved)
	}
	return nil
}

// setresuid and setresgid are the raw system calls, which change the
// calling thread alone (unix.Setresuid is syscall.Setresuid, which changes
// every thread of the process).
func setresuid(r, e, s int) error {
	if _, _, errno := unix.RawSyscall(sysSetresuid, uintptr(r), uintptr(e), uintptr(s)); errno != 0 {
		return errno
	}
	return nil
}

func setresgid(r, e, s int) error {
	if _, _, errno := unix.RawSyscall(sysSetresgid, uintptr(r), uintptr(e), uintptr(s)); errno != 0 {
		return errno
	}
	return nil
}

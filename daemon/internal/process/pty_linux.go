package process

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// SpawnPTY starts cmd on a new pseudo-terminal of cols×rows (unsized when
// either is 0) as the leader of a new session, the terminal its
// controlling one, and records its process group. The Proc's Stdout is
// the master, and its Stdin another descriptor of the master, for input
// and resizes (SetWinsize), that can be closed at the exit while the
// output is still being read.
func (m *Manager) SpawnPTY(cmd *exec.Cmd, cols, rows uint16) (p *Proc, retErr error) {
	master, slave, err := OpenPTY()
	if err != nil {
		return nil, fmt.Errorf("open a pseudo-terminal: %w", err)
	}
	defer slave.Close()
	defer func() {
		if retErr != nil {
			master.Close()
		}
	}()
	if cols > 0 && rows > 0 {
		if err := SetWinsize(master, cols, rows); err != nil {
			return nil, fmt.Errorf("size the pseudo-terminal: %w", err)
		}
	}
	in, err := dupFile(master)
	if err != nil {
		return nil, fmt.Errorf("pseudo-terminal input: %w", err)
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = false // setsid makes a new group
	cmd.SysProcAttr.Setsid, cmd.SysProcAttr.Setctty, cmd.SysProcAttr.Ctty = true, true, 0
	pid, exit, err := m.reaper.Start(cmd)
	if err != nil {
		in.Close()
		return nil, startError(cmd, err)
	}
	m.addGroup(pid)
	return &Proc{PID: pid, Exit: exit, Stdout: master, Stdin: in, Start: time.Now()}, nil
}

// OpenPTY opens a pseudo-terminal pair. It does its own ioctls, through
// SyscallConn, so that the master stays non-blocking (creack/pty's use
// File.Fd, which makes it blocking): reads and writes on it can then be
// interrupted by deadlines and Close.
func OpenPTY() (master, slave *os.File, retErr error) {
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if retErr != nil {
			master.Close()
		}
	}()
	var n uint32
	if err := control(master, func(fd int) error {
		var err error
		if n, err = unix.IoctlGetUint32(fd, unix.TIOCGPTN); err != nil {
			return fmt.Errorf("TIOCGPTN: %w", err)
		}
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
			return fmt.Errorf("unlock: %w", err)
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	slave, err = os.OpenFile("/dev/pts/"+strconv.FormatUint(uint64(n), 10), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	return master, slave, nil
}

// SetWinsize sets the size of the terminal of f (a descriptor of its
// master); the kernel tells the foreground process group with SIGWINCH.
func SetWinsize(f *os.File, cols, rows uint16) error {
	return control(f, func(fd int) error {
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Col: cols, Row: rows})
	})
}

// dupFile is a new descriptor of f's open file (close-on-exec), as its own
// *os.File.
func dupFile(f *os.File) (*os.File, error) {
	var nfd int
	if err := control(f, func(fd int) error {
		var err error
		nfd, err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		return err
	}); err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(nfd), f.Name()), nil
}

// control runs fn on f's descriptor without making it blocking.
func control(f *os.File, fn func(fd int) error) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var fnErr error
	if err := sc.Control(func(fd uintptr) { fnErr = fn(int(fd)) }); err != nil {
		return err
	}
	return fnErr
}

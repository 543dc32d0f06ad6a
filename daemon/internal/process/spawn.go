package process

import (
	"fmt"
	"os"
	"os/exec"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Proc is a started child with its own process group (its pid).
type Proc struct {
	PID    int
	Exit   <-chan ExitStatus
	Stdout *os.File
	Stderr *os.File // nil on a terminal, whose output is all Stdout
	Stdin  *os.File // nil unless asked for
	Start  time.Time
}

// Spawn starts cmd with pipes for stdout and stderr, and for stdin when
// withStdin (otherwise stdin is /dev/null), and records its process group.
// cmd.SysProcAttr must ask for a process group of its own.
func (m *Manager) Spawn(cmd *exec.Cmd, withStdin bool) (p *Proc, retErr error) {
	var toClose []*os.File
	defer func() {
		for _, f := range toClose {
			f.Close()
		}
	}()
	outR, outW, err := childPipe(false)
	if err != nil {
		return nil, err
	}
	errR, errW, err := childPipe(false)
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, err
	}
	toClose = append(toClose, outW, errW)
	defer func() {
		if retErr != nil {
			outR.Close()
			errR.Close()
		}
	}()
	var inW *os.File
	if withStdin {
		w, inR, err := childPipe(true)
		if err != nil {
			return nil, err
		}
		toClose = append(toClose, inR)
		cmd.Stdin, inW = inR, w
	} else if null, err := devNull(); err == nil {
		cmd.Stdin = null // shared, never closed
	} else {
		// No /dev/null in this image: an empty, closed pipe reads as EOF too.
		inR, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		w.Close()
		toClose = append(toClose, inR)
		cmd.Stdin = inR
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	pid, exit, err := m.reaper.Start(cmd)
	if err != nil {
		if inW != nil {
			inW.Close()
		}
		return nil, startError(cmd, err)
	}
	m.addGroup(pid)
	return &Proc{PID: pid, Exit: exit, Stdout: outR, Stderr: errR, Stdin: inW, Start: time.Now()}, nil
}

// startError says which command could not start; the OS error stays
// wrapped for the protocol's edge to classify.
func startError(cmd *exec.Cmd, err error) error {
	return fmt.Errorf("start %s: %w", cmd.Path, err)
}

// childPipe returns a pipe between the daemon and a child: the daemon's end
// non-blocking, in Go's netpoller, the child's end blocking, as os.Pipe and
// exec would leave them but in half the system calls (os.Pipe makes both
// ends non-blocking and exec makes the child's blocking again). The child
// reads from it when toChild, else writes to it.
func childPipe(toChild bool) (ours, theirs *os.File, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, nil, os.NewSyscallError("pipe2", err)
	}
	o, t := p[0], p[1]
	if toChild {
		o, t = t, o // ours is the write end
	}
	// O_NONBLOCK is the only status flag a pipe end has: clear it on theirs.
	if _, err := unix.FcntlInt(uintptr(t), unix.F_SETFL, 0); err != nil {
		unix.Close(o)
		unix.Close(t)
		return nil, nil, os.NewSyscallError("fcntl", err)
	}
	return os.NewFile(uintptr(o), "|ours"), os.NewFile(uintptr(t), "|theirs"), nil
}

// devNull is /dev/null opened once, every child's stdin when it has none.
var devNull = sync.OnceValues(func() (*os.File, error) { return os.Open(os.DevNull) })

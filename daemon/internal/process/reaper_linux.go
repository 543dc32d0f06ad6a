package process

import (
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// ExitStatus is how a child ended.
type ExitStatus struct {
	Code   int    // exit code, or 128+signal when killed
	Signal string // signal name when killed ("KILL")
}

// Reaper collects the exit statuses of the daemon's children. With reapAll it
// also reaps every other child that ends up with the daemon — orphans
// reparented to PID 1 — so no zombie stays behind. Children must be started
// through Start so that their status is not reaped before it is claimed.
type Reaper struct {
	reapAll bool

	// mu guards waiting and is held across fork and registration, so the
	// reaping loop cannot collect a child before it is registered.
	mu      sync.Mutex
	waiting map[int]waiter
	once    sync.Once
}

type waiter struct {
	ch   chan ExitStatus
	proc *os.Process
}

// NewReaper returns a Reaper. reapAll is for PID 1 (or a child subreaper):
// it reaps every child on SIGCHLD; otherwise each child is waited for alone.
func NewReaper(reapAll bool) *Reaper {
	return &Reaper{reapAll: reapAll, waiting: map[int]waiter{}}
}

// Start starts cmd and returns its pid and a channel that receives its exit
// status once. cmd must not be waited for by other means, and its Process
// not read after Start returns: a child that has exited may have been
// released already, which sets Process.Pid to -1.
func (r *Reaper) Start(cmd *exec.Cmd) (int, <-chan ExitStatus, error) {
	ch := make(chan ExitStatus, 1)
	if !r.reapAll {
		if err := cmd.Start(); err != nil {
			return 0, nil, err
		}
		pid := cmd.Process.Pid
		unshieldOOM(pid)
		go func() {
			ch <- waitPID(pid)
			_ = cmd.Process.Release()
		}()
		return pid, ch, nil
	}
	r.once.Do(r.loop)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return 0, nil, err
	}
	pid := cmd.Process.Pid
	r.waiting[pid] = waiter{ch: ch, proc: cmd.Process}
	unshieldOOM(pid)
	return pid, ch, nil
}

// ownOOMScoreAdj is the daemon's own oom_score_adj, read once.
var ownOOMScoreAdj = sync.OnceValue(func() int {
	b, err := os.ReadFile("/proc/self/oom_score_adj")
	if err != nil {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return 0
	}
	return n
})

// unshieldOOM makes a child the OOM killer's first choice over the daemon.
// When a sandbox runs out of memory (a fork bomb of shells is enough), the
// kernel must kill the task's processes and not PID 1, whose death would end
// the sandbox. Lowering the daemon's own score needs CAP_SYS_RESOURCE, which
// sandboxes do not have; raising a child's needs nothing, so every child
// gets the daemon's score + 1000 (at most 1000) as soon as it exists, and
// its descendants inherit it. What the child forks in the microseconds
// before that keeps the daemon's score.
func unshieldOOM(pid int) {
	adj := min(1000, ownOOMScoreAdj()+1000)
	if adj <= ownOOMScoreAdj() {
		return
	}
	// Plain system calls: os.WriteFile's File costs a stat and finalizer more.
	fd, err := unix.Open("/proc/"+strconv.Itoa(pid)+"/oom_score_adj", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return
	}
	_, _ = unix.Write(fd, []byte(strconv.Itoa(adj)))
	unix.Close(fd)
}

func waitPID(pid int) ExitStatus {
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(pid, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return ExitStatus{Code: -1}
		}
		return toStatus(ws)
	}
}

func toStatus(ws unix.WaitStatus) ExitStatus {
	if ws.Signaled() {
		return ExitStatus{Code: 128 + int(ws.Signal()), Signal: signalName(ws.Signal())}
	}
	return ExitStatus{Code: ws.ExitStatus()}
}

// loop reaps children on every SIGCHLD.
func (r *Reaper) loop() {
	sigs := make(chan os.Signal, 64)
	signal.Notify(sigs, syscall.SIGCHLD)
	go func() {
		for range sigs {
			r.reap()
		}
	}()
}

func (r *Reaper) reap() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		if w, ok := r.waiting[pid]; ok {
			w.ch <- toStatus(ws)
			_ = w.proc.Release()
			delete(r.waiting, pid)
		}
	}
}

// signalName is the short name of a signal ("KILL").
func signalName(s syscall.Signal) string {
	n := unix.SignalName(s)
	if n == "" {
		return s.String()
	}
	return n[3:]
}

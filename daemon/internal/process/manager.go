// Package process is the daemon's process core, under every protocol it
// speaks: it starts children (pipes or a pseudo-terminal, each in a
// process group of its own), reaps them, bounds how many are alive,
// tracks background processes in one table with their output in a ring,
// and runs each child through one loop (output, exit, drain, timeout).
// What a protocol keeps about a process rides along as an opaque Meta.
package process

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var (
	// ErrNoSlot: every process slot is taken (Config.MaxProcesses).
	ErrNoSlot = errors.New("no process slot free")
	// ErrShuttingDown: the daemon is stopping and starts nothing new.
	ErrShuttingDown = errors.New("the sandbox is shutting down")
)

// Config configures a Manager.
type Config struct {
	// Reaper collects exit statuses (required).
	Reaper *Reaper
	// MaxProcesses caps the processes alive at once (required).
	MaxProcesses int
	// OutputBytes is how much output a tracked process retains.
	OutputBytes int
	// KillGrace is how long a TERM'd process group gets before KILL.
	KillGrace time.Duration
	// Now is the clock of output and exit times.
	Now func() time.Time
}

// Manager starts, tracks and stops the daemon's children.
type Manager struct {
	cfg    Config
	reaper *Reaper
	// Table holds the tracked (background) processes.
	Table *Table

	// running counts what is in progress: execs, tracked processes,
	// session runs, attaches.
	running atomic.Int32
	// slots bounds processes alive at once.
	slots chan struct{}
	// shuttingDown refuses new work once Shutdown starts.
	shuttingDown atomic.Bool

	// groupsMu guards groups: every process group started and alive, for
	// forwarding TERM at shutdown.
	groupsMu sync.Mutex
	groups   map[int]struct{}
}

// New returns a Manager for cfg.
func New(cfg Config) *Manager {
	return &Manager{
		cfg:    cfg,
		reaper: cfg.Reaper,
		Table:  newTable(),
		slots:  make(chan struct{}, cfg.MaxProcesses),
		groups: map[int]struct{}{},
	}
}

// SlotError is ErrNoSlot with the limit.
type SlotError struct{ Max int }

func (e SlotError) Error() string {
	return fmt.Sprintf("%d processes are already running in this sandbox (the daemon's limit); wait for some to exit or kill them", e.Max)
}

func (e SlotError) Is(target error) bool { return target == ErrNoSlot }

// Acquire takes a process slot: ErrShuttingDown, or a SlotError when none
// is free.
func (m *Manager) Acquire() error {
	if m.shuttingDown.Load() {
		return ErrShuttingDown
	}
	select {
	case m.slots <- struct{}{}:
		return nil
	default:
		return SlotError{Max: m.cfg.MaxProcesses}
	}
}

// Release gives a slot back.
func (m *Manager) Release() { <-m.slots }

// Active counts delta more (or, negative, fewer) things in progress.
func (m *Manager) Active(delta int) { m.running.Add(int32(delta)) }

// Running is how many things are in progress.
func (m *Manager) Running() int { return int(m.running.Load()) }

func (m *Manager) addGroup(pgid int) {
	m.groupsMu.Lock()
	if len(m.groups) >= 2*m.cfg.MaxProcesses {
		m.pruneGroupsLocked()
	}
	m.groups[pgid] = struct{}{}
	m.groupsMu.Unlock()
}

// ForgetGroup drops pgid once no process of the group is left.
func (m *Manager) ForgetGroup(pgid int) {
	if syscall.Kill(-pgid, 0) != syscall.ESRCH {
		return
	}
	m.groupsMu.Lock()
	delete(m.groups, pgid)
	m.groupsMu.Unlock()
}

// pruneGroupsLocked drops groups with no process left.
func (m *Manager) pruneGroupsLocked() {
	for pgid := range m.groups {
		if syscall.Kill(-pgid, 0) == syscall.ESRCH {
			delete(m.groups, pgid)
		}
	}
}

// SignalGroup sends sig to process group pgid.
func (m *Manager) SignalGroup(pgid int, sig syscall.Signal) error {
	return syscall.Kill(-pgid, sig)
}

// signalGroups sends sig to every live process group started.
func (m *Manager) signalGroups(sig syscall.Signal) {
	m.groupsMu.Lock()
	defer m.groupsMu.Unlock()
	for pgid := range m.groups {
		_ = syscall.Kill(-pgid, sig)
	}
}

// Terminate sends TERM to the group, then KILL after the grace period
// unless done is closed first.
func (m *Manager) Terminate(pgid int, done <-chan struct{}) {
	_ = m.SignalGroup(pgid, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(m.cfg.KillGrace):
		_ = m.SignalGroup(pgid, syscall.SIGKILL)
	}
}

// Shutdown refuses new work, sends TERM to every process group started,
// and KILLs what is left when ctx ends; it returns once the groups are
// gone (or, should a KILLed process hang in the kernel, 2 s after the
// KILL), so that nothing started outlives a daemon that has stopped.
func (m *Manager) Shutdown(ctx context.Context) {
	m.shuttingDown.Store(true)
	m.signalGroups(syscall.SIGTERM)
	if m.waitGroupsGone(ctx) {
		return
	}
	m.signalGroups(syscall.SIGKILL)
	kctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	m.waitGroupsGone(kctx)
}

// waitGroupsGone polls until no process group started has a member left,
// or ctx ends (false).
func (m *Manager) waitGroupsGone(ctx context.Context) bool {
	for {
		m.groupsMu.Lock()
		m.pruneGroupsLocked()
		n := len(m.groups)
		m.groupsMu.Unlock()
		if n == 0 {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
}

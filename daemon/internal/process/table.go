package process

import (
	"os"
	"slices"
	"strconv"
	"sync"
	"time"
)

// maxExitedProcesses is how many exited processes stay listed (with their
// output) before the oldest are forgotten.
const maxExitedProcesses = 256

// MainID is the id of the sandbox's main process, which is never evicted.
const MainID = "main"

// Process is a tracked process: a background process of any protocol, or
// the main process.
type Process struct {
	ID      string
	PID     int
	Cmd     []string
	Tag     string
	Started time.Time
	Out     *Output
	// Done is closed when the process has exited and its output is
	// complete.
	Done chan struct{}
	// Meta is what the protocol that started the process keeps about it
	// (nil for none); set before the process is listed.
	Meta any
	// InputMu serialises writes to stdin, so each lands whole.
	InputMu sync.Mutex

	// mu guards the fields below.
	mu       sync.Mutex
	stdin    *os.File
	exited   bool
	status   ExitStatus
	exitedAt time.Time
	timedOut bool
}

// State is how a tracked process stands.
type State struct {
	Exited   bool
	Status   ExitStatus // once exited
	ExitedAt time.Time  // once exited
	TimedOut bool
}

// State reads how p stands.
func (p *Process) State() State {
	p.mu.Lock()
	defer p.mu.Unlock()
	return State{Exited: p.exited, Status: p.status, ExitedAt: p.exitedAt, TimedOut: p.timedOut}
}

// HasExited reports whether p has exited.
func (p *Process) HasExited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// Stdin is p's open stdin (for a terminal, a descriptor of its master), or
// nil once closed, and whether p has exited.
func (p *Process) Stdin() (in *os.File, exited bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stdin, p.exited
}

// CloseStdin closes p's stdin, so that it reads end of file; closing it
// again does nothing.
func (p *Process) CloseStdin() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
}

// Table holds the tracked processes by id.
type Table struct {
	// mu guards byID and seq.
	mu   sync.Mutex
	byID map[string]*Process
	seq  int
}

func newTable() *Table { return &Table{byID: map[string]*Process{}} }

// add lists p, giving it an id ("p1", "p2", …) unless it has one, and
// forgets the oldest exited processes past the limit.
func (t *Table) add(p *Process) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p.ID == "" {
		t.seq++
		p.ID = "p" + strconv.Itoa(t.seq)
	}
	t.byID[p.ID] = p
	t.evictLocked()
}

// evictLocked forgets the oldest exited processes past the limit.
func (t *Table) evictLocked() {
	var exited []*Process
	for _, p := range t.byID {
		if p.ID != MainID && p.HasExited() {
			exited = append(exited, p)
		}
	}
	if len(exited) <= maxExitedProcesses {
		return
	}
	slices.SortFunc(exited, func(a, b *Process) int { return a.Started.Compare(b.Started) })
	for _, p := range exited[:len(exited)-maxExitedProcesses] {
		delete(t.byID, p.ID)
	}
}

// Get is the process with id.
func (t *Table) Get(id string) (*Process, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.byID[id]
	return p, ok
}

// Remove forgets the process with id.
func (t *Table) Remove(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.byID, id)
}

// Snapshot returns every process in the table, oldest first.
func (t *Table) Snapshot() []*Process {
	t.mu.Lock()
	ps := make([]*Process, 0, len(t.byID))
	for _, p := range t.byID {
		ps = append(ps, p)
	}
	t.mu.Unlock()
	slices.SortFunc(ps, func(a, b *Process) int { return a.Started.Compare(b.Started) })
	return ps
}

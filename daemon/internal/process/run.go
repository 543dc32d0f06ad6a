package process

import (
	"bytes"
	"io"
	"os"
	"syscall"
	"time"
)

// The streams of a process's output.
const (
	Stdout = "stdout"
	Stderr = "stderr"
)

// After a process exits, its output may still be in the pipes (a fast
// writer on a busy machine), or children may hold them open (`server &`).
// The wait for the pipes ends once they have been quiet for
// DrainAfterExit, and at the latest drainMax after the exit; what children
// write later is read on and kept or dropped (RunSpec.Late), so they never
// block on a full pipe.
const (
	DrainAfterExit = 100 * time.Millisecond
	drainMax       = 2 * time.Second
)

// exitDrain is the timer of that wait.
type exitDrain struct {
	timer    *time.Timer
	deadline time.Time
}

// startDrain starts the wait at a process's exit; its channel fires when the
// wait is over.
func startDrain() (*exitDrain, <-chan time.Time) {
	d := &exitDrain{timer: time.NewTimer(DrainAfterExit), deadline: time.Now().Add(drainMax)}
	return d, d.timer.C
}

// output restarts the quiet period after output arrived, never past the
// deadline. It does nothing before the exit (d == nil).
func (d *exitDrain) output() {
	if d == nil {
		return
	}
	d.timer.Reset(max(0, min(DrainAfterExit, time.Until(d.deadline))))
}

func (d *exitDrain) stop() {
	if d != nil {
		d.timer.Stop()
	}
}

// PipeChunk is a piece of a pipe as Pump hands it on: data, a read error,
// or the end.
type PipeChunk struct {
	Stream string
	Data   []byte
	Err    error
	EOF    bool
}

// Pump reads f to EOF, handing each chunk to out (a fresh slice each
// time), then an EOF chunk.
func Pump(f *os.File, stream string, out chan<- PipeChunk) {
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			out <- PipeChunk{Stream: stream, Data: bytes.Clone(buf[:n])}
		}
		if err != nil {
			if err != io.EOF {
				out <- PipeChunk{Stream: stream, Err: err}
			}
			out <- PipeChunk{Stream: stream, EOF: true}
			return
		}
	}
}

// RunSpec is how Run runs a process.
type RunSpec struct {
	// Timeout, when positive, KILLs the process group after it.
	Timeout time.Duration
	// KillLeftovers KILLs, at the timeout, what the process left running
	// in its group after it exited in time.
	KillLeftovers bool
	// Output receives the output as it comes until the drain ends; false
	// (its reader is gone) KILLs the process group.
	Output func(stream string, p []byte) bool
	// Late, when set, receives what children still holding the pipes
	// write after the drain; without it, that is read and dropped.
	Late func(stream string, p []byte)
	// Exited, when set, learns the exit status at the exit, before the
	// drain.
	Exited func(ExitStatus)
	// TimedOut, when set, is called when the timeout fires, before the
	// KILL.
	TimedOut func()
	// Gone, when it closes (the caller went away), KILLs the process
	// group.
	Gone <-chan struct{}
}

// Run is the one loop every process goes through: it pumps p's output to
// spec.Output, waits for the exit and for the pipes to drain, and enforces
// the timeout. It returns the exit status and whether the timeout fired.
func (m *Manager) Run(p *Proc, spec RunSpec) (ExitStatus, bool) {
	chunks := make(chan PipeChunk, 16)
	open := 1
	go Pump(p.Stdout, Stdout, chunks)
	if p.Stderr != nil {
		open++
		go Pump(p.Stderr, Stderr, chunks)
	}
	var timeout <-chan time.Time
	if spec.Timeout > 0 {
		t := time.NewTimer(spec.Timeout)
		defer func() {
			if !spec.KillLeftovers || timeout == nil {
				t.Stop()
			}
		}()
		timeout = t.C
	}
	kill := func() { _ = m.SignalGroup(p.PID, syscall.SIGKILL) }
	var (
		status   *ExitStatus
		timedOut bool
		drainer  *exitDrain
		drain    <-chan time.Time
		gone     = spec.Gone
	)
	defer func() { drainer.stop() }()
	for open > 0 || status == nil {
		select {
		case c := <-chunks:
			switch {
			case c.EOF:
				open--
			case c.Data != nil:
				drainer.output()
				if !spec.Output(c.Stream, c.Data) {
					kill()
				}
			}
		case st := <-p.Exit:
			status = &st
			if spec.Exited != nil {
				spec.Exited(st)
			}
			drainer, drain = startDrain()
		case <-drain:
			// Children still hold the pipes: keep reading them.
			go func(open int) {
				for open > 0 {
					c := <-chunks
					if c.EOF {
						open--
					} else if c.Data != nil && spec.Late != nil {
						spec.Late(c.Stream, c.Data)
					}
				}
			}(open)
			open = 0
		case <-timeout:
			timedOut = true
			timeout = nil
			if spec.TimedOut != nil {
				spec.TimedOut()
			}
			kill()
		case <-gone:
			gone = nil
			kill()
		}
	}
	if timedOut {
		// The whole group goes, children included.
		kill()
	} else if timeout != nil && spec.KillLeftovers {
		// Children the command left in its group are killed at its deadline.
		go func(deadline <-chan time.Time, pgid int) {
			<-deadline
			_ = m.SignalGroup(pgid, syscall.SIGKILL)
			m.ForgetGroup(pgid)
		}(timeout, p.PID)
	}
	return *status, timedOut
}

// TrackSpec is what Track records about a process and how it keeps it.
type TrackSpec struct {
	// ID is the process's id in the table ("" for the next "pN").
	ID, Tag string
	Argv    []string
	// Timeout, when positive, KILLs the process group after it.
	Timeout time.Duration
	// Tee, when set, also receives the output.
	Tee func(stream string, p []byte)
	// Meta is the protocol's (Process.Meta).
	Meta any
}

// Track takes a process slot, starts a process with spawn and tracks it in
// the table: its output is retained (a terminal's, whose Proc has no
// stderr, as stdout), it counts as running, and its slot is released once
// it has exited.
func (m *Manager) Track(spec TrackSpec, spawn func() (*Proc, error)) (*Process, error) {
	if err := m.Acquire(); err != nil {
		return nil, err
	}
	pr, err := spawn()
	if err != nil {
		m.Release()
		return nil, err
	}
	m.Active(1)
	p := &Process{
		ID: spec.ID, PID: pr.PID, Cmd: spec.Argv, Tag: spec.Tag, Started: pr.Start,
		Out: newOutput(m.cfg.OutputBytes), Done: make(chan struct{}), stdin: pr.Stdin, Meta: spec.Meta,
	}
	m.Table.add(p)
	keep := func(stream string, b []byte) { p.Out.write(stream, b, m.cfg.Now()) }
	go func() {
		defer m.Release()
		defer m.Active(-1)
		m.Run(pr, RunSpec{
			Timeout: spec.Timeout,
			Output: func(stream string, b []byte) bool {
				keep(stream, b)
				if spec.Tee != nil {
					spec.Tee(stream, b)
				}
				return true
			},
			Late: keep,
			Exited: func(st ExitStatus) {
				p.mu.Lock()
				p.exited, p.status, p.exitedAt = true, st, m.cfg.Now()
				if p.stdin != nil {
					p.stdin.Close()
					p.stdin = nil
				}
				p.mu.Unlock()
			},
			TimedOut: func() {
				p.mu.Lock()
				p.timedOut = true
				p.mu.Unlock()
			},
		})
		p.Out.close()
		close(p.Done)
		m.ForgetGroup(pr.PID)
	}()
	return p, nil
}

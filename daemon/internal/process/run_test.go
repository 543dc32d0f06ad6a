package process

import (
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func newManager(t *testing.T) *Manager {
	t.Helper()
	return New(Config{Reaper: NewReaper(false), MaxProcesses: 4, OutputBytes: 1 << 20, KillGrace: time.Second, Now: time.Now})
}

func shell(script string) *exec.Cmd {
	return &exec.Cmd{Path: "/bin/sh", Args: []string{"sh", "-c", script}, SysProcAttr: &syscall.SysProcAttr{Setpgid: true}}
}

// TestRun: the one loop every process goes through, on pipes and on a
// terminal.
func TestRun(t *testing.T) {
	if _, err := exec.LookPath("sh"); err != nil {
		t.Skip("no sh")
	}
	for _, tc := range []struct {
		name     string
		script   string
		pty      bool
		timeout  time.Duration
		want     map[string]string
		code     int
		timedOut bool
	}{
		{name: "output and exit code", script: "echo out; echo err >&2; exit 3",
			want: map[string]string{Stdout: "out\n", Stderr: "err\n"}, code: 3},
		{name: "a background child holding the pipes does not hold the run", script: "echo x; sleep 30 &",
			want: map[string]string{Stdout: "x\n"}},
		{name: "the timeout kills the group", script: "echo before; sleep 30", timeout: 200 * time.Millisecond,
			want: map[string]string{Stdout: "before\n"}, code: 128 + int(syscall.SIGKILL), timedOut: true},
		{name: "a terminal's output is all stdout", script: "echo tty; echo err >&2", pty: true,
			want: map[string]string{Stdout: "tty\r\nerr\r\n"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newManager(t)
			var p *Proc
			var err error
			if tc.pty {
				p, err = m.SpawnPTY(shell(tc.script), 80, 24)
			} else {
				p, err = m.Spawn(shell(tc.script), false)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = m.SignalGroup(p.PID, syscall.SIGKILL) }()
			var mu sync.Mutex
			got := map[string]*strings.Builder{Stdout: {}, Stderr: {}}
			st, timedOut := m.Run(p, RunSpec{Timeout: tc.timeout, Output: func(stream string, b []byte) bool {
				mu.Lock()
				defer mu.Unlock()
				got[stream].Write(b)
				return true
			}})
			if st.Code != tc.code || timedOut != tc.timedOut {
				t.Errorf("status %+v, timed out %v; want code %d, timed out %v", st, timedOut, tc.code, tc.timedOut)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, s := range []string{Stdout, Stderr} {
				if got[s].String() != tc.want[s] {
					t.Errorf("%s = %q, want %q", s, got[s].String(), tc.want[s])
				}
			}
		})
	}
}

// TestTrack: a tracked process holds a slot until it exits, and its
// output and status are kept.
func TestTrack(t *testing.T) {
	m := New(Config{Reaper: NewReaper(false), MaxProcesses: 1, OutputBytes: 1 << 20, KillGrace: time.Second, Now: time.Now})
	p, err := m.Track(TrackSpec{Argv: []string{"sh"}, Tag: "t"}, func() (*Proc, error) { return m.Spawn(shell("echo hi; exit 2"), false) })
	if err != nil {
		t.Fatal(err)
	}
	if p.ID != "p1" {
		t.Errorf("id %q, want p1", p.ID)
	}
	<-p.Done
	st := p.State()
	if !st.Exited || st.Status.Code != 2 {
		t.Errorf("state %+v, want exited with 2", st)
	}
	chunks, _, _, closed, _ := p.Out.Read(0)
	if len(chunks) != 1 || string(chunks[0].Data) != "hi\n" || !closed {
		t.Errorf("output %v (closed %v), want hi", chunks, closed)
	}
	// The slot is free again once the process is done.
	deadline := time.Now().Add(5 * time.Second)
	for m.Acquire() != nil {
		if time.Now().After(deadline) {
			t.Fatal("the slot was not released")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := m.Acquire(); err == nil || err.Error() != (SlotError{Max: 1}).Error() {
		t.Errorf("second Acquire: %v, want a SlotError", err)
	}
}

package daemon

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/internal/process"
)

// A session is a persistent shell. Each run writes the command to a file in
// the session's directory and asks the shell to source it with stdin from
// /dev/null, so cwd, variables and functions persist, heredocs and any
// syntax work, and commands that read stdin get EOF. After the command the
// shell prints a marker with a per-run random token on stdout (carrying $?)
// and on stderr; everything before the markers is the run's exact output.
type session struct {
	id      string
	shell   string
	pid     int
	dir     string
	started time.Time
	stdin   *os.File
	// exited is closed when the shell has exited.
	exited chan struct{}

	// runMu serialises runs.
	runMu sync.Mutex

	// mu guards the fields below.
	mu     sync.Mutex
	status process.ExitStatus
	// sink receives output while a run is active; output between runs
	// (from background jobs) is dropped.
	sink *runSink
	busy bool
}

func (ss *session) info() api.Session {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	alive := true
	select {
	case <-ss.exited:
		alive = false
	default:
	}
	return api.Session{ID: ss.id, PID: ss.pid, Shell: ss.shell, Busy: ss.busy, Alive: alive, StartedAt: ss.started}
}

// runSink is where a run receives output; done is closed when the run ends
// so a forwarder never blocks on a finished run.
type runSink struct {
	ch   chan process.PipeChunk
	done chan struct{}
}

type sessionTable struct {
	// mu guards byID and seq.
	mu   sync.Mutex
	byID map[string]*session
	seq  int
}

func newSessionTable() *sessionTable { return &sessionTable{byID: map[string]*session{}} }

func (t *sessionTable) get(id string) (*session, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	ss, ok := t.byID[id]
	if !ok {
		return nil, errf(http.StatusNotFound, api.CodeNotFound, "no session %q (create one with POST /v1/sessions)", id)
	}
	return ss, nil
}

func (s *Server) createSession(w http.ResponseWriter, r *http.Request) {
	var req api.SessionRequest
	if r.ContentLength != 0 {
		if err := s.decode(w, r, &req); err != nil {
			writeError(w, err)
			return
		}
	}
	sh, err := s.shellPath(req.ShellPath)
	if err != nil {
		writeError(w, err)
		return
	}
	cmd, err := s.command(commandSpec{argv: []string{sh}, env: req.Env, cwd: req.Cwd})
	if err != nil {
		writeError(w, err)
		return
	}
	s.sessions.mu.Lock()
	s.sessions.seq++
	id := "s" + strconv.Itoa(s.sessions.seq)
	s.sessions.mu.Unlock()
	dir := filepath.Join(s.cfg.StateDir, "sessions", id)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		writeError(w, fmt.Errorf("session state dir: %w", err))
		return
	}
	if err := s.procs.Acquire(); err != nil {
		os.RemoveAll(dir)
		writeError(w, err)
		return
	}
	p, err := s.procs.Spawn(cmd, true)
	if err != nil {
		s.procs.Release()
		os.RemoveAll(dir)
		writeError(w, err)
		return
	}
	ss := &session{id: id, shell: sh, pid: p.PID, dir: dir, started: p.Start, stdin: p.Stdin, exited: make(chan struct{})}
	// A trap (not an ignore) so that INT reaches the foreground command,
	// which gets the default action back on exec, while the shell lives on.
	if _, err := p.Stdin.WriteString("trap : INT\n"); err != nil {
		_ = s.procs.SignalGroup(p.PID, syscall.SIGKILL)
	}
	chunks := make(chan process.PipeChunk, 16)
	go process.Pump(p.Stdout, api.EventStdout, chunks)
	go process.Pump(p.Stderr, api.EventStderr, chunks)
	go func() {
		for open := 2; open > 0; {
			c := <-chunks
			if c.EOF {
				open--
				continue
			}
			ss.mu.Lock()
			sink := ss.sink
			ss.mu.Unlock()
			if sink != nil && c.Data != nil {
				select {
				case sink.ch <- c:
				case <-sink.done:
				}
			}
		}
	}()
	go func() {
		st := <-p.Exit
		ss.mu.Lock()
		ss.status = st
		ss.mu.Unlock()
		close(ss.exited)
		ss.stdin.Close()
		s.procs.Release()
		s.procs.ForgetGroup(p.PID)
	}()
	s.sessions.mu.Lock()
	s.sessions.byID[id] = ss
	s.sessions.mu.Unlock()
	writeJSON(w, http.StatusCreated, ss.info())
}

func (s *Server) listSessions(w http.ResponseWriter, r *http.Request) {
	s.sessions.mu.Lock()
	out := make([]api.Session, 0, len(s.sessions.byID))
	for _, ss := range s.sessions.byID {
		out = append(out, ss.info())
	}
	s.sessions.mu.Unlock()
	slices.SortFunc(out, func(a, b api.Session) int { return a.StartedAt.Compare(b.StartedAt) })
	writeJSON(w, http.StatusOK, out)
}

// markerScanner collects one stream's run output up to a cap and finds the
// end marker, which may arrive split across reads.
type markerScanner struct {
	marker  []byte
	out     capture
	pending []byte
	found   bool
	rest    []byte // bytes after the marker (stdout: the exit code and '.')
}

func (m *markerScanner) add(p []byte) {
	if m.found {
		m.rest = append(m.rest, p...)
		return
	}
	m.pending = append(m.pending, p...)
	if i := bytes.Index(m.pending, m.marker); i >= 0 {
		m.out.add(m.pending[:i])
		m.rest = append(m.rest, m.pending[i+len(m.marker):]...)
		m.pending, m.found = nil, true
		return
	}
	// Keep only what could still be the start of a marker.
	keep := min(len(m.pending), len(m.marker)-1)
	m.out.add(m.pending[:len(m.pending)-keep])
	m.pending = append(m.pending[:0], m.pending[len(m.pending)-keep:]...)
}

// exitCode parses "<code>." after the stdout marker; ok is false until the
// '.' has arrived.
func (m *markerScanner) exitCode() (int, bool) {
	i := bytes.IndexByte(m.rest, '.')
	if !m.found || i < 0 {
		return 0, false
	}
	code, err := strconv.Atoi(string(m.rest[:i]))
	if err != nil {
		return -1, true
	}
	return code, true
}

func (s *Server) runSession(w http.ResponseWriter, r *http.Request) {
	ss, err := s.sessions.get(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	var req api.RunRequest
	if err := s.decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.TimeoutSeconds < 0 || req.MaxOutputBytes < 0 {
		writeError(w, errf(http.StatusBadRequest, api.CodeBadRequest, "timeout_seconds and max_output_bytes must not be negative"))
		return
	}
	if !ss.runMu.TryLock() {
		writeError(w, errf(http.StatusConflict, api.CodeConflict,
			"session %s is running another command; wait for it, interrupt it, or use another session", ss.id))
		return
	}
	defer ss.runMu.Unlock()
	select {
	case <-ss.exited:
		writeError(w, errf(http.StatusConflict, api.CodeConflict, "the shell of session %s has exited; create a new session", ss.id))
		return
	default:
	}
	s.procs.Active(1)
	defer s.procs.Active(-1)
	res, err := s.run(ss, req)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) run(ss *session, req api.RunRequest) (api.RunResult, error) {
	start := time.Now()
	limit := req.MaxOutputBytes
	if limit == 0 {
		limit = s.cfg.MaxOutputBytes
	}
	// The directory may have been removed by a command; make it again.
	if err := os.MkdirAll(ss.dir, 0o700); err != nil {
		return api.RunResult{}, fmt.Errorf("session state dir: %w", err)
	}
	file := filepath.Join(ss.dir, "cmd")
	if err := os.WriteFile(file, []byte(req.Command+"\n"), 0o600); err != nil {
		return api.RunResult{}, fmt.Errorf("write session command: %w", err)
	}
	var tok [12]byte
	_, _ = rand.Read(tok[:])
	marker := "SANDMAN-END-" + hex.EncodeToString(tok[:])
	outScan := &markerScanner{marker: []byte(marker + "-"), out: capture{limit: limit}}
	errScan := &markerScanner{marker: []byte(marker + "."), out: capture{limit: limit}}

	sink := &runSink{ch: make(chan process.PipeChunk, 16), done: make(chan struct{})}
	ss.mu.Lock()
	ss.sink, ss.busy = sink, true
	ss.mu.Unlock()
	defer func() {
		ss.mu.Lock()
		ss.sink, ss.busy = nil, false
		ss.mu.Unlock()
		close(sink.done)
	}()

	line := fmt.Sprintf("{ command . %s; } </dev/null; printf '%s-%%d.' \"$?\"; printf '%s.' >&2\n",
		shellQuote(file), marker, marker)
	if _, err := ss.stdin.WriteString(line); err != nil {
		return api.RunResult{}, errf(http.StatusConflict, api.CodeConflict, "the shell of session %s is gone: %v", ss.id, err)
	}

	var timeout, escalate <-chan time.Time
	if req.TimeoutSeconds > 0 {
		t := time.NewTimer(time.Duration(req.TimeoutSeconds * float64(time.Second)))
		defer t.Stop()
		timeout = t.C
	}
	res := api.RunResult{SessionAlive: true}
	code, done := 0, false
	for !done {
		select {
		case c := <-sink.ch:
			if c.Stream == api.EventStdout {
				outScan.add(c.Data)
			} else {
				errScan.add(c.Data)
			}
			var ok bool
			if code, ok = outScan.exitCode(); ok && errScan.found {
				done = true
			}
		case <-ss.exited:
			// The command ended the shell (exit, exec, or a kill).
			ss.mu.Lock()
			code, res.Signal = ss.status.Code, ss.status.Signal
			ss.mu.Unlock()
			res.SessionAlive = false
			done = true
		case <-timeout:
			res.TimedOut = true
			timeout = nil
			_ = s.procs.SignalGroup(ss.pid, syscall.SIGINT)
			escalate = time.After(s.cfg.KillGrace)
		case <-escalate:
			// INT was not enough: kill the command's processes, then, if the
			// shell itself is stuck in a builtin loop, the shell.
			killGroupExcept(ss.pid, ss.pid)
			escalate = nil
			time.AfterFunc(s.cfg.KillGrace, func() {
				ss.mu.Lock()
				busy := ss.sink == sink
				ss.mu.Unlock()
				if busy {
					_ = s.procs.SignalGroup(ss.pid, syscall.SIGKILL)
				}
			})
		}
	}
	// What arrived before the markers is the run's output; anything after
	// them came from background jobs.
	outScan.out.add(outScan.pending)
	errScan.out.add(errScan.pending)
	res.ExitCode = code
	res.Truncated = outScan.out.truncated || errScan.out.truncated
	res.DurationMS = time.Since(start).Milliseconds()
	setOutput(&res.Stdout, &res.StdoutBase64, outScan.out.buf)
	setOutput(&res.Stderr, &res.StderrBase64, errScan.out.buf)
	return res, nil
}

func (s *Server) interruptSession(w http.ResponseWriter, r *http.Request) {
	ss, err := s.sessions.get(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	if err := s.procs.SignalGroup(ss.pid, syscall.SIGINT); err != nil {
		writeError(w, errf(http.StatusConflict, api.CodeConflict, "session %s: %v", ss.id, err))
		return
	}
	writeJSON(w, http.StatusOK, ss.info())
}

func (s *Server) deleteSession(w http.ResponseWriter, r *http.Request) {
	ss, err := s.sessions.get(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	done := make(chan struct{})
	go func() { <-ss.exited; close(done) }()
	ss.stdin.Close()
	s.procs.Terminate(ss.pid, done)
	<-ss.exited
	s.sessions.mu.Lock()
	delete(s.sessions.byID, ss.id)
	s.sessions.mu.Unlock()
	os.RemoveAll(ss.dir)
	writeJSON(w, http.StatusOK, ss.info())
}

// shellQuote quotes s for a POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// killGroupExcept sends KILL to every process in group pgid but keep.
func killGroupExcept(pgid, keep int) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == keep {
			continue
		}
		if pg, err := syscall.Getpgid(pid); err == nil && pg == pgid {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

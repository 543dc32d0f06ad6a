package daemon

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandman-dev/sandman/daemon/api"
)

// maxExitedProcesses is how many exited processes stay listed (with their
// output) before the oldest are forgotten.
const maxExitedProcesses = 256

// process is a background process (or the main process, id "main").
type process struct {
	id      string
	pid     int
	cmd     []string
	tag     string
	started time.Time
	out     *outputBuffer
	// done is closed when the process has exited and its output is complete.
	done chan struct{}

	// envd is set, before the process is listed, for processes started
	// through envd's process service.
	envd *envdMeta
	// inputMu serialises envd's writes to stdin.
	inputMu sync.Mutex

	// mu guards the fields below.
	mu       sync.Mutex
	stdin    *os.File
	exited   bool
	status   exitStatus
	exitedAt time.Time
	timedOut bool
}

func (p *process) info() api.Process {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := api.Process{
		ID: p.id, PID: p.pid, Cmd: p.cmd, Tag: p.tag, Running: !p.exited,
		StartedAt: p.started, OutputBytes: p.out.total(), TimedOut: p.timedOut,
	}
	if p.exited {
		code, at := p.status.code, p.exitedAt
		out.ExitCode, out.Signal, out.ExitedAt = &code, p.status.signal, &at
	}
	return out
}

type processTable struct {
	// mu guards byID and seq.
	mu   sync.Mutex
	byID map[string]*process
	seq  int
}

func newProcessTable() *processTable { return &processTable{byID: map[string]*process{}} }

func (t *processTable) add(p *process) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p.id == "" {
		t.seq++
		p.id = "p" + strconv.Itoa(t.seq)
	}
	t.byID[p.id] = p
	t.evictLocked()
}

// evictLocked forgets the oldest exited processes past the limit.
func (t *processTable) evictLocked() {
	var exited []*process
	for _, p := range t.byID {
		p.mu.Lock()
		if p.exited && p.id != "main" {
			exited = append(exited, p)
		}
		p.mu.Unlock()
	}
	if len(exited) <= maxExitedProcesses {
		return
	}
	slices.SortFunc(exited, func(a, b *process) int { return a.started.Compare(b.started) })
	for _, p := range exited[:len(exited)-maxExitedProcesses] {
		delete(t.byID, p.id)
	}
}

func (t *processTable) get(id string) (*process, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	p, ok := t.byID[id]
	if !ok {
		return nil, errf(http.StatusNotFound, api.CodeNotFound, "no process %q (list them with GET /v1/processes)", id)
	}
	return p, nil
}

func (t *processTable) remove(id string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.byID, id)
}

// snapshot returns every process in the table, in no order.
func (t *processTable) snapshot() []*process {
	t.mu.Lock()
	defer t.mu.Unlock()
	ps := make([]*process, 0, len(t.byID))
	for _, p := range t.byID {
		ps = append(ps, p)
	}
	return ps
}

func (t *processTable) list() []api.Process {
	t.mu.Lock()
	ps := make([]*process, 0, len(t.byID))
	for _, p := range t.byID {
		ps = append(ps, p)
	}
	t.mu.Unlock()
	out := make([]api.Process, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.info())
	}
	slices.SortFunc(out, func(a, b api.Process) int { return a.StartedAt.Compare(b.StartedAt) })
	return out
}

// startBackground starts cmd as a tracked process whose output is retained.
// It holds a process slot and counts as running until the process exits.
func (s *Server) startBackground(id string, cmd *exec.Cmd, withStdin bool, timeout time.Duration, tag string, tee func(stream string, p []byte)) (*process, error) {
	return s.startTracked(trackSpec{id: id, argv: cmd.Args, tag: tag, timeout: timeout, tee: tee},
		func() (*proc, error) { return s.spawn(cmd, withStdin) })
}

// trackSpec is what startTracked records about a process and how it keeps it.
type trackSpec struct {
	id, tag string
	argv    []string
	// timeout, when positive, KILLs the process group after it.
	timeout time.Duration
	// tee, when set, also receives the output.
	tee  func(stream string, p []byte)
	envd *envdMeta
}

// startTracked takes a process slot, starts a process with spawn and tracks
// it: its output is retained (a terminal's, whose proc has no stderr, as
// stdout), it counts as running, and its slot is released once it has
// exited.
func (s *Server) startTracked(spec trackSpec, spawn func() (*proc, error)) (*process, error) {
	if err := s.acquire(); err != nil {
		return nil, err
	}
	pr, err := spawn()
	if err != nil {
		s.release()
		return nil, err
	}
	s.running.Add(1)
	p := &process{
		id: spec.id, pid: pr.pid, cmd: spec.argv, tag: spec.tag, started: pr.start,
		out: newOutputBuffer(s.cfg.ProcessOutputBytes), done: make(chan struct{}), stdin: pr.stdin, envd: spec.envd,
	}
	s.procs.add(p)

	chunks := make(chan chunk, 16)
	outputs := 1
	go pump(pr.stdout, api.EventStdout, chunks)
	if pr.stderr != nil {
		outputs++
		go pump(pr.stderr, api.EventStderr, chunks)
	}
	go func() {
		defer s.release()
		defer s.running.Add(-1)
		var timer <-chan time.Time
		if spec.timeout > 0 {
			t := time.NewTimer(spec.timeout)
			defer t.Stop()
			timer = t.C
		}
		open, exited := outputs, false
		var (
			drainer *exitDrain
			drain   <-chan time.Time
		)
		defer func() { drainer.stop() }()
		for open > 0 || !exited {
			select {
			case c := <-chunks:
				if c.eof {
					open--
				} else if c.data != nil {
					drainer.output()
					p.out.write(c.stream, c.data, s.cfg.Now())
					if spec.tee != nil {
						spec.tee(c.stream, c.data)
					}
				}
			case st := <-pr.exit:
				exited = true
				p.mu.Lock()
				p.exited, p.status, p.exitedAt = true, st, s.cfg.Now()
				if p.stdin != nil {
					p.stdin.Close()
					p.stdin = nil
				}
				p.mu.Unlock()
				drainer, drain = startDrain()
			case <-drain:
				// Children still hold the pipes: keep their output as it comes.
				go func(open int) {
					for open > 0 {
						c := <-chunks
						if c.eof {
							open--
						} else if c.data != nil {
							p.out.write(c.stream, c.data, s.cfg.Now())
						}
					}
				}(open)
				open = 0
			case <-timer:
				timer = nil
				p.mu.Lock()
				p.timedOut = true
				p.mu.Unlock()
				_ = s.signalGroup(pr.pid, sigKILL)
			}
		}
		p.out.close()
		close(p.done)
		s.forgetGroup(pr.pid)
	}()
	return p, nil
}

func (s *Server) startProcess(w http.ResponseWriter, r *http.Request) {
	var req api.ProcessRequest
	if err := s.decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.TimeoutSeconds < 0 {
		writeError(w, errf(http.StatusBadRequest, api.CodeBadRequest, "timeout_seconds must not be negative"))
		return
	}
	cmd, err := s.command(commandSpec{argv: req.Cmd, shell: req.Shell, shellPath: req.ShellPath, env: req.Env, cwd: req.Cwd})
	if err != nil {
		writeError(w, err)
		return
	}
	p, err := s.startBackground("", cmd, req.Stdin, time.Duration(req.TimeoutSeconds*float64(time.Second)), req.Tag, nil)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, p.info())
}

func (s *Server) listProcesses(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.procs.list())
}

func (s *Server) getProcess(w http.ResponseWriter, r *http.Request) {
	p, err := s.procs.get(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	if r.URL.Query().Get("wait") == "1" {
		select {
		case <-p.done:
		case <-r.Context().Done():
			return
		}
	}
	writeJSON(w, http.StatusOK, p.info())
}

// processOutput streams a process's retained output from ?offset= as NDJSON
// events; with ?follow=1 it keeps streaming until the process exits and its
// output is complete, then sends the exit event.
func (s *Server) processOutput(w http.ResponseWriter, r *http.Request) {
	p, err := s.procs.get(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	q := r.URL.Query()
	var offset int64
	if v := q.Get("offset"); v != "" {
		if offset, err = strconv.ParseInt(v, 10, 64); err != nil || offset < 0 {
			writeError(w, errf(http.StatusBadRequest, api.CodeBadRequest, "offset %q: want a byte offset ≥ 0", v))
			return
		}
	}
	follow := q.Get("follow") == "1"
	rc := http.NewResponseController(w)
	if follow {
		_ = rc.SetWriteDeadline(time.Time{})
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	first := true
	for {
		chunks, dropped, next, closed, changed := p.out.read(offset)
		for i, c := range chunks {
			ev := api.Event{Type: c.stream, Offset: c.off, Time: c.time, Data: c.data}
			if i == 0 && first {
				ev.Dropped = dropped
			}
			if enc.Encode(ev) != nil {
				return
			}
		}
		first = first && len(chunks) == 0
		offset = next
		if closed {
			info := p.info()
			_ = enc.Encode(api.Event{Type: api.EventExit, Offset: offset, ExitCode: info.ExitCode,
				Signal: info.Signal, TimedOut: info.TimedOut})
			return
		}
		if !follow {
			return
		}
		if rc.Flush() != nil {
			return
		}
		select {
		case <-changed:
		case <-r.Context().Done():
			return
		}
	}
}

func (s *Server) processStdin(w http.ResponseWriter, r *http.Request) {
	p, err := s.procs.get(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	p.mu.Lock()
	in := p.stdin
	p.mu.Unlock()
	if in == nil {
		writeError(w, errf(http.StatusConflict, api.CodeConflict,
			"process %s has no open stdin (start it with \"stdin\": true; it is closed once the process exits or after ?close=1)", p.id))
		return
	}
	n, err := io.Copy(in, r.Body)
	if err != nil && !isClosedPipe(err) {
		writeError(w, fmt.Errorf("write stdin of process %s: %w", p.id, err))
		return
	}
	if r.URL.Query().Get("close") == "1" {
		p.mu.Lock()
		if p.stdin != nil {
			p.stdin.Close()
			p.stdin = nil
		}
		p.mu.Unlock()
	}
	writeJSON(w, http.StatusOK, map[string]int64{"bytes": n})
}

func isClosedPipe(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "broken pipe") || strings.Contains(err.Error(), "file already closed"))
}

func (s *Server) signalProcess(w http.ResponseWriter, r *http.Request) {
	p, err := s.procs.get(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	var req api.SignalRequest
	if err := s.decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	sig, err := parseSignal(req.Signal)
	if err != nil {
		writeError(w, err)
		return
	}
	target := p.pid
	if req.Group == nil || *req.Group {
		target = -p.pid
	}
	if err := syscall.Kill(target, sig); err != nil {
		if err == syscall.ESRCH {
			writeError(w, errf(http.StatusConflict, api.CodeConflict, "process %s has exited", p.id))
			return
		}
		writeError(w, fmt.Errorf("signal process %s: %w", p.id, err))
		return
	}
	writeJSON(w, http.StatusOK, p.info())
}

// deleteProcess kills a running process's group (TERM, grace, KILL), waits
// for it and forgets it; it answers with the final status.
func (s *Server) deleteProcess(w http.ResponseWriter, r *http.Request) {
	p, err := s.procs.get(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	if p.id == "main" {
		writeError(w, errf(http.StatusConflict, api.CodeConflict, "the main process ends with the sandbox: delete the pod"))
		return
	}
	s.terminate(p.pid, p.done)
	<-p.done
	s.procs.remove(p.id)
	writeJSON(w, http.StatusOK, p.info())
}

// parseSignal accepts "TERM", "SIGTERM" or "15".
func parseSignal(v string) (syscall.Signal, error) {
	v = strings.ToUpper(strings.TrimSpace(v))
	if v == "" {
		return 0, errf(http.StatusBadRequest, api.CodeBadRequest, "signal is required, e.g. \"TERM\" or \"9\"")
	}
	if n, err := strconv.Atoi(v); err == nil {
		if n <= 0 || n > 64 {
			return 0, errf(http.StatusBadRequest, api.CodeBadRequest, "signal %d out of range 1-64", n)
		}
		return syscall.Signal(n), nil
	}
	if !strings.HasPrefix(v, "SIG") {
		v = "SIG" + v
	}
	if sig := unix.SignalNum(v); sig != 0 {
		return sig, nil
	}
	return 0, errf(http.StatusBadRequest, api.CodeBadRequest, "unknown signal %q", v)
}

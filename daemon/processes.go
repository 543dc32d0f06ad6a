package daemon

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/internal/process"
)

// processInfo is a tracked process as the v1 API shows it.
func processInfo(p *process.Process) api.Process {
	st := p.State()
	out := api.Process{
		ID: p.ID, PID: p.PID, Cmd: p.Cmd, Tag: p.Tag, Running: !st.Exited,
		StartedAt: p.Started, OutputBytes: p.Out.Total(), TimedOut: st.TimedOut,
	}
	if st.Exited {
		code, at := st.Status.Code, st.ExitedAt
		out.ExitCode, out.Signal, out.ExitedAt = &code, st.Status.Signal, &at
	}
	return out
}

// process is the tracked process with id, or a v1 not_found error.
func (s *Server) process(id string) (*process.Process, error) {
	p, ok := s.procs.Table.Get(id)
	if !ok {
		return nil, errf(http.StatusNotFound, api.CodeNotFound, "no process %q (list them with GET /v1/processes)", id)
	}
	return p, nil
}

// startBackground starts cmd as a tracked process whose output is retained.
// It holds a process slot and counts as running until the process exits.
func (s *Server) startBackground(id string, cmd *exec.Cmd, withStdin bool, timeout time.Duration, tag string, tee func(stream string, p []byte)) (*process.Process, error) {
	return s.procs.Track(process.TrackSpec{ID: id, Argv: cmd.Args, Tag: tag, Timeout: timeout, Tee: tee},
		func() (*process.Proc, error) { return s.procs.Spawn(cmd, withStdin) })
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
	writeJSON(w, http.StatusCreated, processInfo(p))
}

func (s *Server) listProcesses(w http.ResponseWriter, r *http.Request) {
	ps := s.procs.Table.Snapshot()
	out := make([]api.Process, 0, len(ps))
	for _, p := range ps {
		out = append(out, processInfo(p))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) getProcess(w http.ResponseWriter, r *http.Request) {
	p, err := s.process(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	if r.URL.Query().Get("wait") == "1" {
		select {
		case <-p.Done:
		case <-r.Context().Done():
			return
		}
	}
	writeJSON(w, http.StatusOK, processInfo(p))
}

// processOutput streams a process's retained output from ?offset= as NDJSON
// events; with ?follow=1 it keeps streaming until the process exits and its
// output is complete, then sends the exit event.
func (s *Server) processOutput(w http.ResponseWriter, r *http.Request) {
	p, err := s.process(r.PathValue("id"))
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
		chunks, dropped, next, closed, changed := p.Out.Read(offset)
		for i, c := range chunks {
			ev := api.Event{Type: c.Stream, Offset: c.Off, Time: c.Time, Data: c.Data}
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
			info := processInfo(p)
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
	p, err := s.process(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	in, _ := p.Stdin()
	if in == nil {
		writeError(w, errf(http.StatusConflict, api.CodeConflict,
			"process %s has no open stdin (start it with \"stdin\": true; it is closed once the process exits or after ?close=1)", p.ID))
		return
	}
	n, err := io.Copy(in, r.Body)
	if err != nil && !isClosedPipe(err) {
		writeError(w, fmt.Errorf("write stdin of process %s: %w", p.ID, err))
		return
	}
	if r.URL.Query().Get("close") == "1" {
		p.CloseStdin()
	}
	writeJSON(w, http.StatusOK, map[string]int64{"bytes": n})
}

func isClosedPipe(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "broken pipe") || strings.Contains(err.Error(), "file already closed"))
}

func (s *Server) signalProcess(w http.ResponseWriter, r *http.Request) {
	p, err := s.process(r.PathValue("id"))
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
	target := p.PID
	if req.Group == nil || *req.Group {
		target = -p.PID
	}
	if err := syscall.Kill(target, sig); err != nil {
		if err == syscall.ESRCH {
			writeError(w, errf(http.StatusConflict, api.CodeConflict, "process %s has exited", p.ID))
			return
		}
		writeError(w, fmt.Errorf("signal process %s: %w", p.ID, err))
		return
	}
	writeJSON(w, http.StatusOK, processInfo(p))
}

// deleteProcess kills a running process's group (TERM, grace, KILL), waits
// for it and forgets it; it answers with the final status.
func (s *Server) deleteProcess(w http.ResponseWriter, r *http.Request) {
	p, err := s.process(r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	if p.ID == process.MainID {
		writeError(w, errf(http.StatusConflict, api.CodeConflict, "the main process ends with the sandbox: delete the pod"))
		return
	}
	s.procs.Terminate(p.PID, p.Done)
	<-p.Done
	s.procs.Table.Remove(p.ID)
	writeJSON(w, http.StatusOK, processInfo(p))
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

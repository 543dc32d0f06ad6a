package daemon

import (
	"encoding/json"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/sandman-dev/sandman/daemon/api"
)

// After a process exits, its output may still be in the pipes (a fast writer
// on a busy machine), or children may hold them open (`server &`). The wait
// for the pipes ends once they have been quiet for drainAfterExit, and at the
// latest drainMax after the exit; what children write later is read on and
// kept (background processes) or dropped (exec), so they never block on a
// full pipe.
const (
	drainAfterExit = 100 * time.Millisecond
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
	d := &exitDrain{timer: time.NewTimer(drainAfterExit), deadline: time.Now().Add(drainMax)}
	return d, d.timer.C
}

// output restarts the quiet period after output arrived, never past the
// deadline. It does nothing before the exit (d == nil).
func (d *exitDrain) output() {
	if d == nil {
		return
	}
	d.timer.Reset(max(0, min(drainAfterExit, time.Until(d.deadline))))
}

func (d *exitDrain) stop() {
	if d != nil {
		d.timer.Stop()
	}
}

// capture keeps the first limit bytes written and counts the rest.
type capture struct {
	limit     int64
	buf       []byte
	truncated bool
}

func (c *capture) add(p []byte) (kept []byte) {
	room := c.limit - int64(len(c.buf))
	if room <= 0 {
		c.truncated = c.truncated || len(p) > 0
		return nil
	}
	if int64(len(p)) > room {
		p = p[:room]
		c.truncated = true
	}
	c.buf = append(c.buf, p...)
	return p
}

// setOutput fills the result's text or base64 fields for out.
func setOutput(text *string, b64 *[]byte, out []byte) {
	if utf8.Valid(out) {
		*text = string(out)
	} else {
		*b64 = out
	}
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	var req api.ExecRequest
	if err := s.decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if req.TimeoutSeconds < 0 || req.MaxOutputBytes < 0 {
		writeError(w, errf(http.StatusBadRequest, api.CodeBadRequest, "timeout_seconds and max_output_bytes must not be negative"))
		return
	}
	cmd, err := s.command(commandSpec{argv: req.Cmd, shell: req.Shell, shellPath: req.ShellPath, env: req.Env, cwd: req.Cwd})
	if err != nil {
		writeError(w, err)
		return
	}
	if err := s.acquire(); err != nil {
		writeError(w, err)
		return
	}
	defer s.release()
	s.running.Add(1)
	defer s.running.Add(-1)

	p, err := s.spawn(cmd, req.Stdin != nil)
	if err != nil {
		writeError(w, err)
		return
	}
	defer s.forgetGroup(p.pid)
	if p.stdin != nil {
		go func() {
			_, _ = p.stdin.Write(req.Stdin)
			p.stdin.Close()
		}()
	}
	limit := req.MaxOutputBytes
	if limit == 0 {
		limit = s.cfg.MaxOutputBytes
	}
	stream := r.URL.Query().Get("stream") == "1"
	var enc *json.Encoder
	var rc *http.ResponseController
	if stream {
		rc = http.NewResponseController(w)
		_ = rc.SetWriteDeadline(time.Time{})
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.WriteHeader(http.StatusOK)
		enc = json.NewEncoder(w)
		_ = rc.Flush()
	}

	chunks := make(chan chunk, 16)
	go pump(p.stdout, api.EventStdout, chunks)
	go pump(p.stderr, api.EventStderr, chunks)

	var timeout <-chan time.Time
	if req.TimeoutSeconds > 0 {
		timeout = time.After(time.Duration(req.TimeoutSeconds * float64(time.Second)))
	}
	out := map[string]*capture{api.EventStdout: {limit: limit}, api.EventStderr: {limit: limit}}
	var (
		status   *exitStatus
		timedOut bool
		clientOK = true
		open     = 2
		drainer  *exitDrain
		drain    <-chan time.Time
		done     = r.Context().Done()
	)
	defer func() { drainer.stop() }()
	for open > 0 || status == nil {
		select {
		case c := <-chunks:
			switch {
			case c.eof:
				open--
			case c.data != nil:
				drainer.output()
				kept := out[c.stream].add(c.data)
				if stream && clientOK && len(kept) > 0 {
					if err := enc.Encode(api.Event{Type: c.stream, Data: kept}); err != nil || rc.Flush() != nil {
						clientOK = false
						_ = s.signalGroup(p.pid, sigKILL)
					}
				}
			}
		case st := <-p.exit:
			status = &st
			drainer, drain = startDrain()
		case <-drain:
			// Children still hold the pipes: keep reading them, dropping the output.
			go func(open int) {
				for open > 0 {
					if c := <-chunks; c.eof {
						open--
					}
				}
			}(open)
			open = 0
		case <-timeout:
			timedOut = true
			timeout = nil
			_ = s.signalGroup(p.pid, sigKILL)
		case <-done:
			// The caller is gone and nobody will read the result.
			done = nil
			clientOK = false
			_ = s.signalGroup(p.pid, sigKILL)
		}
	}
	if timedOut {
		// The whole group goes, children included.
		_ = s.signalGroup(p.pid, sigKILL)
	} else if timeout != nil {
		// Children the command left in its group are killed at its deadline.
		go func(deadline <-chan time.Time, pgid int) {
			<-deadline
			_ = s.signalGroup(pgid, sigKILL)
			s.forgetGroup(pgid)
		}(timeout, p.pid)
	}
	res := api.ExecResult{
		ExitCode:   status.code,
		Signal:     status.signal,
		TimedOut:   timedOut,
		Truncated:  out[api.EventStdout].truncated || out[api.EventStderr].truncated,
		DurationMS: time.Since(p.start).Milliseconds(),
	}
	if stream {
		if clientOK {
			code := res.ExitCode
			_ = enc.Encode(api.Event{Type: api.EventExit, ExitCode: &code, Signal: res.Signal,
				TimedOut: res.TimedOut, Truncated: res.Truncated, DurationMS: res.DurationMS})
			_ = rc.Flush()
		}
		return
	}
	setOutput(&res.Stdout, &res.StdoutBase64, out[api.EventStdout].buf)
	setOutput(&res.Stderr, &res.StderrBase64, out[api.EventStderr].buf)
	if clientOK {
		writeJSON(w, http.StatusOK, res)
	}
}

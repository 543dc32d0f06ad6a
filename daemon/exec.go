package daemon

import (
	"encoding/json"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/internal/process"
)

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
	if err := s.procs.Acquire(); err != nil {
		writeError(w, err)
		return
	}
	defer s.procs.Release()
	s.procs.Active(1)
	defer s.procs.Active(-1)

	p, err := s.procs.Spawn(cmd, req.Stdin != nil)
	if err != nil {
		writeError(w, err)
		return
	}
	defer s.procs.ForgetGroup(p.PID)
	if p.Stdin != nil {
		go func() {
			_, _ = p.Stdin.Write(req.Stdin)
			p.Stdin.Close()
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

	out := map[string]*capture{api.EventStdout: {limit: limit}, api.EventStderr: {limit: limit}}
	ctx := r.Context()
	clientOK := true
	status, timedOut := s.procs.Run(p, process.RunSpec{
		Timeout:       time.Duration(req.TimeoutSeconds * float64(time.Second)),
		KillLeftovers: true,
		Output: func(streamName string, b []byte) bool {
			kept := out[streamName].add(b)
			clientOK = clientOK && ctx.Err() == nil
			if stream && clientOK && len(kept) > 0 {
				if err := enc.Encode(api.Event{Type: streamName, Data: kept}); err != nil || rc.Flush() != nil {
					clientOK = false
					return false
				}
			}
			return true
		},
		// The caller is gone and nobody will read the result.
		Gone: ctx.Done(),
	})
	clientOK = clientOK && ctx.Err() == nil
	res := api.ExecResult{
		ExitCode:   status.Code,
		Signal:     status.Signal,
		TimedOut:   timedOut,
		Truncated:  out[api.EventStdout].truncated || out[api.EventStderr].truncated,
		DurationMS: time.Since(p.Start).Milliseconds(),
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

package daemon

import (
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/internal/process"
)

// attach runs a command interactively over a WebSocket. The framing is the
// Kubernetes channel protocol (v4.channel.k8s.io), so a kubelet API can
// bridge kubectl exec to it byte for byte: every binary message starts with
// a channel byte — 0 stdin (client→), 1 stdout, 2 stderr, 3 status (a JSON
// metav1.Status when the command ends), 4 resize (client→, JSON
// {"Width":w,"Height":h}). Query: cmd (repeated argv; default the shell),
// tty=1, stdin=1, cols, rows, cwd, env (repeated K=V).
func (s *Server) attach(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	argv := q["cmd"]
	if len(argv) == 0 {
		sh, err := s.shellPath("")
		if err != nil {
			writeError(w, err)
			return
		}
		argv = []string{sh}
	}
	env := map[string]string{}
	for _, kv := range q["env"] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			writeError(w, errf(http.StatusBadRequest, api.CodeBadRequest, "env %q: want KEY=VALUE", kv))
			return
		}
		env[k] = v
	}
	tty := q.Get("tty") == "1"
	if tty {
		if _, ok := env["TERM"]; !ok {
			env["TERM"] = "xterm"
		}
	}
	cmd, err := s.command(commandSpec{argv: argv, env: env, cwd: q.Get("cwd")})
	if err != nil {
		writeError(w, err)
		return
	}
	if err := s.procs.Acquire(); err != nil {
		writeError(w, err)
		return
	}
	defer s.procs.Release()

	conn, err := websocket.Accept(w, r, &websocket.AcceptOptions{
		Subprotocols:       []string{"v4.channel.k8s.io", "channel.k8s.io"},
		InsecureSkipVerify: true, // bearer-token auth, not cookies: cross-origin is fine
	})
	if err != nil {
		return // Accept has answered
	}
	conn.SetReadLimit(1 << 20)
	defer conn.CloseNow()
	s.procs.Active(1)
	defer s.procs.Active(-1)

	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	var wmu sync.Mutex
	send := func(ch byte, p []byte) error {
		wmu.Lock()
		defer wmu.Unlock()
		return conn.Write(ctx, websocket.MessageBinary, append([]byte{ch}, p...))
	}

	var p *process.Proc
	var startErr error
	if tty {
		cols, rows := atoiOr(q.Get("cols"), 80), atoiOr(q.Get("rows"), 24)
		if cols <= 0 || rows <= 0 || cols > math.MaxUint16 || rows > math.MaxUint16 {
			cols, rows = 0, 0 // the terminal's default
		}
		p, startErr = s.procs.SpawnPTY(cmd, uint16(cols), uint16(rows))
	} else {
		p, startErr = s.procs.Spawn(cmd, q.Get("stdin") == "1")
	}
	if startErr != nil {
		_ = send(3, statusJSON(-1, classify(startErr).msg))
		conn.Close(websocket.StatusNormalClosure, "")
		return
	}
	pgid, exit := p.PID, p.Exit
	outputs := []*os.File{p.Stdout}
	if p.Stderr != nil {
		outputs = append(outputs, p.Stderr)
	}
	var stdin io.WriteCloser
	if p.Stdin != nil {
		stdin = p.Stdin
	}
	var resize func(w, h uint16)
	if tty {
		// p.Stdin is a descriptor of the terminal's master.
		master := p.Stdin
		resize = func(w, h uint16) { _ = process.SetWinsize(master, w, h) }
	}
	defer s.procs.ForgetGroup(pgid)

	// Client → process: stdin and resize messages. A closed connection
	// hangs up the command, as closing a terminal would.
	go func() {
		defer func() {
			if stdin != nil {
				stdin.Close()
			}
			if ctx.Err() == nil {
				_ = s.procs.SignalGroup(pgid, syscall.SIGHUP)
			}
		}()
		for {
			_, msg, err := conn.Read(ctx)
			if err != nil || len(msg) == 0 {
				if err != nil {
					return
				}
				continue
			}
			switch msg[0] {
			case 0:
				if stdin != nil {
					if len(msg) == 1 { // an empty stdin frame closes stdin
						stdin.Close()
						stdin = nil
						continue
					}
					_, _ = stdin.Write(msg[1:])
				}
			case 4:
				var sz struct{ Width, Height uint16 }
				if json.Unmarshal(msg[1:], &sz) == nil && resize != nil && sz.Width > 0 && sz.Height > 0 {
					resize(sz.Width, sz.Height)
				}
			}
		}
	}()

	var wg sync.WaitGroup
	for i, f := range outputs {
		wg.Add(1)
		go func(ch byte, f *os.File) {
			defer wg.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := f.Read(buf)
				if n > 0 && send(ch, buf[:n]) != nil {
					_ = s.procs.SignalGroup(pgid, syscall.SIGHUP)
				}
				if err != nil {
					return
				}
			}
		}(byte(i+1), f)
	}
	st := <-exit
	if tty {
		// The pty master reads EIO once every holder of the slave is gone;
		// background children may keep it, so do not wait for them.
		for _, f := range outputs {
			_ = f.SetReadDeadline(deadlineSoon())
		}
	}
	wg.Wait()
	for _, f := range outputs {
		f.Close()
	}
	msg := ""
	if st.Signal != "" {
		msg = "killed by signal " + st.Signal
	}
	_ = send(3, statusJSON(st.Code, msg))
	conn.Close(websocket.StatusNormalClosure, "")
}

// statusJSON is the metav1.Status that ends a Kubernetes channel stream.
func statusJSON(code int, msg string) []byte {
	if code == 0 {
		return []byte(`{"metadata":{},"status":"Success"}`)
	}
	type cause struct {
		Reason  string `json:"reason"`
		Message string `json:"message"`
	}
	st := map[string]any{
		"metadata": map[string]any{},
		"status":   "Failure",
		"message":  msg,
		"reason":   "NonZeroExitCode",
		"details":  map[string]any{"causes": []cause{{Reason: "ExitCode", Message: strconv.Itoa(code)}}},
	}
	if code < 0 {
		st["reason"] = "InternalError"
		st["details"] = map[string]any{}
	} else if msg == "" {
		st["message"] = "command terminated with non-zero exit code: exit status " + strconv.Itoa(code)
	}
	b, _ := json.Marshal(st)
	return b
}

func deadlineSoon() time.Time { return time.Now().Add(process.DrainAfterExit) }

func atoiOr(v string, def int) int {
	n, err := strconv.Atoi(v)
	if err != nil {
		return def
	}
	return n
}

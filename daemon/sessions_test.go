package daemon_test

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
)

func TestSessionBehavesLikeAShell(t *testing.T) {
	for _, shell := range []string{"/bin/sh", "/bin/bash"} {
		t.Run(shell, func(t *testing.T) {
			h := newHarness(t)
			ctx := t.Context()
			s, err := h.client.CreateSession(ctx, api.SessionRequest{ShellPath: shell, Env: map[string]string{"GREETING": "hi"}})
			if err != nil {
				t.Fatal(err)
			}
			dir := t.TempDir()
			steps := []struct {
				cmd    string
				code   int
				stdout string
				stderr string
			}{
				{"cd " + dir + "; export X=42; f() { echo \"fn $1\"; }; Y=local", 0, "", ""},
				{"pwd; echo $X $Y $GREETING; f arg", 0, dir + "\n42 local hi\nfn arg\n", ""},
				{"printf 'no newline'", 0, "no newline", ""},
				{"cat <<'EOF'\nheredoc $X\n  indented\nEOF", 0, "heredoc $X\n  indented\n", ""},
				{"cat; read v; echo \"read=$?\"", 0, "read=1\n", ""},
				{"echo out; echo err >&2; false", 1, "out\n", "err\n"},
				{"printf '\\377\\000'", 0, "\xff\x00", ""},
				{"(exit 3)", 3, "", ""},
				{"x='unterminated", 2, "", "*"},
				{"echo still $X", 0, "still 42\n", ""},
			}
			for _, st := range steps {
				res, err := h.client.Run(ctx, s.ID, api.RunRequest{Command: st.cmd})
				if err != nil {
					t.Fatalf("%q: %v", st.cmd, err)
				}
				if res.ExitCode != st.code || string(res.Stdout) != st.stdout || (st.stderr != "*" && string(res.Stderr) != st.stderr) || !res.SessionAlive {
					t.Fatalf("%q: code %d stdout %q stderr %q alive %v; want %d %q %q", st.cmd, res.ExitCode, res.Stdout, res.Stderr, res.SessionAlive, st.code, st.stdout, st.stderr)
				}
				if st.stderr == "*" && len(res.Stderr) == 0 {
					t.Fatalf("%q: want a syntax error on stderr", st.cmd)
				}
			}
			// exit ends the shell; later runs say so.
			res, err := h.client.Run(ctx, s.ID, api.RunRequest{Command: "exit 9"})
			if err != nil || res.ExitCode != 9 || res.SessionAlive {
				t.Fatalf("exit 9: %+v %v", res, err)
			}
			if _, err := h.client.Run(ctx, s.ID, api.RunRequest{Command: "true"}); !client.IsCode(err, api.CodeConflict) {
				t.Fatalf("run after exit: %v", err)
			}
		})
	}
}

func TestSessionLargeOutput(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	s, err := h.client.CreateSession(ctx, api.SessionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	res, err := h.client.Run(ctx, s.ID, api.RunRequest{Command: "head -c 3000000 /dev/zero | tr '\\0' a", MaxOutputBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Truncated || len(res.Stdout) != 1<<20 || !bytes.Equal(res.Stdout[:10], []byte("aaaaaaaaaa")) {
		t.Fatalf("truncated %v len %d", res.Truncated, len(res.Stdout))
	}
	res, err = h.client.Run(ctx, s.ID, api.RunRequest{Command: "echo after"})
	if err != nil || string(res.Stdout) != "after\n" {
		t.Fatalf("after large output: %+v %v", res, err)
	}
}

func TestSessionInterruptAndTimeout(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	s, err := h.client.CreateSession(ctx, api.SessionRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.Run(ctx, s.ID, api.RunRequest{Command: "export KEEP=yes"}); err != nil {
		t.Fatal(err)
	}
	var res *client.ExecResult
	var runErr error
	done := make(chan struct{})
	go func() {
		defer close(done)
		res, runErr = h.client.Run(ctx, s.ID, api.RunRequest{Command: "echo before; sleep 300 && echo not-reached"})
	}()
	eventually(t, 5*time.Second, "the run's sleep to start", func() bool {
		ss := listSessions(t, h)
		return len(ss) == 1 && ss[0].Busy && len(groupMembers(ss[0].PID)) > 1
	})
	if _, err := h.client.Run(ctx, s.ID, api.RunRequest{Command: "true"}); !client.IsCode(err, api.CodeConflict) {
		t.Fatalf("concurrent run in one session: %v", err)
	}
	if err := h.client.Interrupt(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	<-done
	if runErr != nil {
		t.Fatal(runErr)
	}
	if res.ExitCode != 130 || string(res.Stdout) != "before\n" || !res.SessionAlive {
		t.Fatalf("interrupted: %+v", res)
	}
	res, err = h.client.Run(ctx, s.ID, api.RunRequest{Command: "sleep 300", TimeoutSeconds: 0.2})
	if err != nil || !res.TimedOut || !res.SessionAlive {
		t.Fatalf("timeout: %+v %v", res, err)
	}
	res, err = h.client.Run(ctx, s.ID, api.RunRequest{Command: "echo $KEEP"})
	if err != nil || string(res.Stdout) != "yes\n" {
		t.Fatalf("state after interrupt and timeout: %+v %v", res, err)
	}
	// A builtin loop ignores INT; the timeout escalates and reports it.
	res, err = h.client.Run(ctx, s.ID, api.RunRequest{Command: "while :; do :; done", TimeoutSeconds: 0.2})
	if err != nil || !res.TimedOut {
		t.Fatalf("builtin loop: %+v %v", res, err)
	}
}

func listSessions(t *testing.T, h *harness) []api.Session {
	t.Helper()
	out, err := h.sessions(t)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestSessionsConcurrent(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := h.client.CreateSession(ctx, api.SessionRequest{})
			if err != nil {
				errs <- err
				return
			}
			for j := range 5 {
				want := string(rune('a'+i)) + string(rune('0'+j))
				res, err := h.client.Run(ctx, s.ID, api.RunRequest{Command: "V=" + want + "; sleep 0.01; echo $V"})
				if err != nil {
					errs <- err
					return
				}
				if string(res.Stdout) != want+"\n" {
					errs <- &mismatch{want: want, got: string(res.Stdout)}
					return
				}
			}
			if err := h.client.CloseSession(ctx, s.ID); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

type mismatch struct{ want, got string }

func (m *mismatch) Error() string { return "want " + m.want + " got " + m.got }

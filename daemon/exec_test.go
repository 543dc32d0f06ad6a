package daemon_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"

	"testing"
	"time"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
)

func TestAuth(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	cases := []struct {
		name   string
		header string
		want   int
	}{
		{"missing", "", http.StatusUnauthorized},
		{"wrong", "Bearer nope", http.StatusUnauthorized},
		{"not bearer", "Basic " + testToken, http.StatusUnauthorized},
		{"right", "Bearer " + testToken, http.StatusOK},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, h.url+"/v1/processes", nil)
			if tc.header != "" {
				req.Header.Set("Authorization", tc.header)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Fatalf("status = %d, want %d", resp.StatusCode, tc.want)
			}
			if tc.want == http.StatusUnauthorized {
				var eb api.ErrorBody
				if err := json.NewDecoder(resp.Body).Decode(&eb); err != nil || eb.Error.Code != api.CodeUnauthorized {
					t.Fatalf("error body = %+v (%v), want code %s", eb, err, api.CodeUnauthorized)
				}
			}
		})
	}
	// Health needs no token.
	c, _ := client.New(h.url)
	if hl, err := c.Health(ctx); err != nil || hl.Status != "ok" {
		t.Fatalf("health without token = %+v, %v", hl, err)
	}
	// A wrong token never reaches a handler.
	bad, _ := client.New(h.url, client.WithToken("wrong"))
	if _, err := bad.Exec(ctx, api.ExecRequest{Cmd: []string{"true"}}); !client.IsCode(err, api.CodeUnauthorized) {
		t.Fatalf("exec with wrong token: %v", err)
	}
}

func TestNewRequiresAuth(t *testing.T) {
	if _, err := newServerNoAuth(); err == nil {
		t.Fatal("New with no token hash and authentication required: want an error")
	}
}

func TestExec(t *testing.T) {
	h := newHarness(t)
	dir := t.TempDir()
	cases := []struct {
		name       string
		req        api.ExecRequest
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{"argv", api.ExecRequest{Cmd: []string{"echo", "hello", "world"}}, 0, "hello world\n", ""},
		{"shell", api.ExecRequest{Shell: "echo out; echo err >&2; exit 7"}, 7, "out\n", "err\n"},
		{"env merged", api.ExecRequest{Shell: `echo "$FOO-${PATH:+path}"`, Env: map[string]string{"FOO": "bar"}}, 0, "bar-path\n", ""},
		{"cwd", api.ExecRequest{Cmd: []string{"pwd"}, Cwd: dir}, 0, dir + "\n", ""},
		{"stdin", api.ExecRequest{Cmd: []string{"cat"}, Stdin: []byte("piped\x00bytes")}, 0, "piped\x00bytes", ""},
		{"no stdin is EOF", api.ExecRequest{Shell: "read x; echo rc=$?"}, 0, "rc=1\n", ""},
		{"no trailing newline", api.ExecRequest{Cmd: []string{"printf", "%s", "x"}}, 0, "x", ""},
		{"killed by signal", api.ExecRequest{Shell: "kill -9 $$"}, 137, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res, err := h.client.Exec(t.Context(), tc.req)
			if err != nil {
				t.Fatal(err)
			}
			if res.ExitCode != tc.wantCode || string(res.Stdout) != tc.wantStdout || string(res.Stderr) != tc.wantStderr {
				t.Fatalf("got code %d stdout %q stderr %q; want %d %q %q", res.ExitCode, res.Stdout, res.Stderr, tc.wantCode, tc.wantStdout, tc.wantStderr)
			}
		})
	}
}

func TestExecErrors(t *testing.T) {
	h := newHarness(t)
	cases := []struct {
		name string
		req  api.ExecRequest
		code string
	}{
		{"nothing to run", api.ExecRequest{}, api.CodeBadRequest},
		{"both", api.ExecRequest{Cmd: []string{"true"}, Shell: "true"}, api.CodeBadRequest},
		{"not found", api.ExecRequest{Cmd: []string{"no-such-program-xyz"}}, api.CodeNotFound},
		{"relative cwd", api.ExecRequest{Cmd: []string{"true"}, Cwd: "tmp"}, api.CodeBadRequest},
		{"missing cwd", api.ExecRequest{Cmd: []string{"true"}, Cwd: "/no/such/dir"}, api.CodeNotFound},
		{"no shell", api.ExecRequest{Shell: "true", ShellPath: "/no/such/sh"}, api.CodeNoShell},
		{"negative timeout", api.ExecRequest{Cmd: []string{"true"}, TimeoutSeconds: -1}, api.CodeBadRequest},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := h.client.Exec(t.Context(), tc.req)
			if !client.IsCode(err, tc.code) {
				t.Fatalf("err = %v, want code %s", err, tc.code)
			}
		})
	}
}

func TestExecBinaryOutputExact(t *testing.T) {
	h := newHarness(t)
	res, err := h.client.Exec(t.Context(), api.ExecRequest{Shell: `printf '\377\000\001text'; printf '\376' >&2`})
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(res.Stdout, []byte("\xff\x00\x01text")) || !bytes.Equal(res.Stderr, []byte("\xfe")) {
		t.Fatalf("stdout %q stderr %q", res.Stdout, res.Stderr)
	}
}

// TestExecTimeoutKillsGroup: the timeout kills the whole process group,
// children included, and says timed_out.
func TestExecTimeoutKillsGroup(t *testing.T) {
	h := newHarness(t)
	pidFile := t.TempDir() + "/child.pid"
	res, err := h.client.Exec(t.Context(), api.ExecRequest{
		Shell:          "sleep 300 & echo $! > " + pidFile + "; wait",
		TimeoutSeconds: 0.3,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut || res.ExitCode != 137 || res.Signal != "KILL" {
		t.Fatalf("result %+v: want timed_out, 137, KILL", res)
	}
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	child, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	eventually(t, 5*time.Second, "the background child to be killed", func() bool { return !alive(child) })
}

// alive reports whether pid runs (a zombie counts as gone).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] != 'Z'
}

// TestExecHugeOutput: output far past the cap is drained, not buffered, and
// flagged truncated.
func TestExecHugeOutput(t *testing.T) {
	h := newHarness(t)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	res, err := h.client.Exec(t.Context(), api.ExecRequest{Shell: "head -c 2000000000 /dev/zero", MaxOutputBytes: 1000})
	if err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if !res.Truncated || len(res.Stdout) != 1000 || res.ExitCode != 0 {
		t.Fatalf("truncated=%v len=%d code=%d; want true 1000 0", res.Truncated, len(res.Stdout), res.ExitCode)
	}
	if grew := int64(after.HeapInuse) - int64(before.HeapInuse); grew > 64<<20 {
		t.Fatalf("heap grew by %d MiB draining 2 GB of output", grew>>20)
	}
}

// TestExecBackgroundChildDoesNotHang: a command that leaves a child holding
// stdout returns when the command exits.
func TestExecBackgroundChildDoesNotHang(t *testing.T) {
	h := newHarness(t)
	start := time.Now()
	res, err := h.client.Exec(t.Context(), api.ExecRequest{Shell: "sleep 30 & echo started"})
	if err != nil {
		t.Fatal(err)
	}
	if string(res.Stdout) != "started\n" {
		t.Fatalf("stdout %q", res.Stdout)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("exec took %v: it waited for the background child", d)
	}
}

func TestExecStream(t *testing.T) {
	h := newHarness(t)
	st, err := h.client.ExecStream(t.Context(), api.ExecRequest{Shell: "echo one; echo two >&2; exit 3"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var out, errOut bytes.Buffer
	var exit *api.Event
	for {
		ev, err := st.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		switch ev.Type {
		case api.EventStdout:
			out.Write(ev.Data)
		case api.EventStderr:
			errOut.Write(ev.Data)
		case api.EventExit:
			exit = &ev
		}
	}
	if out.String() != "one\n" || errOut.String() != "two\n" || exit == nil || *exit.ExitCode != 3 {
		t.Fatalf("stdout %q stderr %q exit %+v", out.String(), errOut.String(), exit)
	}
}

// TestExecClientDisconnect: a client that goes away mid-stream gets its
// command killed, and the daemon keeps serving.
func TestExecClientDisconnect(t *testing.T) {
	h := newHarness(t)
	ctx, cancel := context.WithCancel(t.Context())
	st, err := h.client.ExecStream(ctx, api.ExecRequest{Shell: "echo $$; exec yes"})
	if err != nil {
		t.Fatal(err)
	}
	ev, err := st.Next()
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(strings.SplitN(string(ev.Data), "\n", 2)[0]))
	if err != nil {
		t.Fatalf("first event %q: %v", ev.Data, err)
	}
	cancel()
	st.Close()
	eventually(t, 5*time.Second, "the command of a gone client to be killed", func() bool { return !alive(pid) })
	if res, err := h.client.Exec(t.Context(), api.ExecRequest{Cmd: []string{"true"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("daemon after disconnect: %+v %v", res, err)
	}
}

func TestBadRequests(t *testing.T) {
	h := newHarness(t, func(c *daemonConfig) { c.MaxBodyBytes = 1024 })
	cases := []struct {
		name   string
		method string
		path   string
		body   string
		status int
		code   string
	}{
		{"malformed json", "POST", "/v1/exec", `{"cmd":`, 400, api.CodeBadRequest},
		{"empty body", "POST", "/v1/exec", ``, 400, api.CodeBadRequest},
		{"unknown field", "POST", "/v1/exec", `{"command":["true"]}`, 400, api.CodeBadRequest},
		{"wrong type", "POST", "/v1/exec", `{"cmd":"true"}`, 400, api.CodeBadRequest},
		{"two values", "POST", "/v1/exec", `{"cmd":["true"]} {}`, 400, api.CodeBadRequest},
		{"huge body", "POST", "/v1/exec", `{"shell":"` + strings.Repeat("x", 4096) + `"}`, 413, api.CodeTooLarge},
		{"unknown endpoint", "GET", "/v1/nope", ``, 404, api.CodeNotFound},
		{"unknown process", "GET", "/v1/processes/p999", ``, 404, api.CodeNotFound},
		{"unknown session", "POST", "/v1/sessions/s999/run", `{"command":"true"}`, 404, api.CodeNotFound},
		{"bad offset", "GET", "/v1/processes/p1/output?offset=-1", ``, 404, api.CodeNotFound},
		{"bad signal", "POST", "/v1/processes/p999/signal", `{"signal":"NOPE"}`, 404, api.CodeNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequestWithContext(t.Context(), tc.method, h.url+tc.path, strings.NewReader(tc.body))
			req.Header.Set("Authorization", "Bearer "+testToken)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var eb api.ErrorBody
			_ = json.NewDecoder(resp.Body).Decode(&eb)
			if resp.StatusCode != tc.status || eb.Error.Code != tc.code || eb.Error.Message == "" {
				t.Fatalf("got %d %+v; want %d %s with a message", resp.StatusCode, eb, tc.status, tc.code)
			}
		})
	}
	if _, err := h.client.Health(t.Context()); err != nil {
		t.Fatalf("daemon after bad requests: %v", err)
	}
}

func TestMaxProcesses(t *testing.T) {
	h := newHarness(t, func(c *daemonConfig) { c.MaxProcesses = 2 })
	ctx := t.Context()
	var ids []string
	for range 2 {
		p, err := h.client.StartProcess(ctx, api.ProcessRequest{Cmd: []string{"sleep", "300"}})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, p.ID)
	}
	if _, err := h.client.Exec(ctx, api.ExecRequest{Cmd: []string{"true"}}); !client.IsCode(err, api.CodeTooManyRequests) {
		t.Fatalf("third process: err = %v, want %s", err, api.CodeTooManyRequests)
	}
	if _, err := h.client.KillProcess(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if res, err := h.client.Exec(ctx, api.ExecRequest{Cmd: []string{"true"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("after freeing a slot: %+v %v", res, err)
	}
}

func TestIdleSeconds(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := func() time.Time { return now }
	h := newHarness(t, func(c *daemonConfig) { c.Now = clock })
	ctx := t.Context()
	if _, err := h.client.Processes(ctx); err != nil { // an authenticated call
		t.Fatal(err)
	}
	now = now.Add(90 * time.Second)
	hl, err := h.client.Health(ctx)
	if err != nil || hl.IdleSeconds != 90 {
		t.Fatalf("idle = %v (%v), want 90", hl.IdleSeconds, err)
	}
	// Health itself does not count as activity.
	now = now.Add(10 * time.Second)
	if hl, _ = h.client.Health(ctx); hl.IdleSeconds != 100 {
		t.Fatalf("idle = %v, want 100", hl.IdleSeconds)
	}
	// A running process keeps it at 0 however long ago the last call was.
	p, err := h.client.StartProcess(ctx, api.ProcessRequest{Cmd: []string{"sleep", "300"}})
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(time.Hour)
	if hl, _ = h.client.Health(ctx); hl.IdleSeconds != 0 || hl.Running != 1 {
		t.Fatalf("with a process running: %+v", hl)
	}
	// The time since the last call goes on, whatever runs.
	if hl.CallIdleSeconds != 3600 {
		t.Fatalf("call idle with a process running = %v, want 3600", hl.CallIdleSeconds)
	}
	if _, err := h.client.KillProcess(ctx, p.ID); err != nil {
		t.Fatal(err)
	}
	now = now.Add(5 * time.Second)
	if err := h.client.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	now = now.Add(3 * time.Second)
	if hl, _ = h.client.Health(ctx); hl.IdleSeconds != 3 {
		t.Fatalf("after renew: idle = %v, want 3", hl.IdleSeconds)
	}
}

// TestCallIdleSeconds: a call in progress keeps the time since the last
// call at 0; its end starts it again.
func TestCallIdleSeconds(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	done := make(chan error, 1)
	go func() {
		_, err := h.client.Exec(ctx, api.ExecRequest{Cmd: []string{"sleep", "1"}})
		done <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		hl, err := h.client.Health(ctx)
		if err == nil && hl.Running == 1 {
			if hl.CallIdleSeconds != 0 {
				t.Fatalf("call idle during an exec = %v, want 0", hl.CallIdleSeconds)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the exec never ran")
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if hl, err := h.client.Health(ctx); err == nil && hl.CallIdleSeconds > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("call idle stayed 0 after the exec ended")
		}
	}
}

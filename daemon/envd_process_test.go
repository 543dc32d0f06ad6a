package daemon_test

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"

	"github.com/sandman-dev/sandman/daemon"
	"github.com/sandman-dev/sandman/daemon/api"
	procpb "github.com/sandman-dev/sandman/daemon/envd/spec/process"
	"github.com/sandman-dev/sandman/daemon/envd/spec/process/processconnect"
)

// envdHarness is a daemon with Connect clients of envd's process service,
// one per codec: JSON as the SDKs use it, and binary.
type envdHarness struct {
	*harness
	cfg    daemon.Config
	codecs []envdCodec
}

type envdCodec struct {
	name   string
	client processconnect.ProcessClient
}

// tokenTransport sends the access token as the SDKs do.
type tokenTransport struct {
	base  http.RoundTripper
	token string
}

func (t tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("X-Access-Token", t.token)
	return t.base.RoundTrip(r)
}

func newEnvdHarness(t *testing.T, mutate ...func(*daemon.Config)) *envdHarness {
	t.Helper()
	var cfg daemon.Config
	h := newHarness(t, append(mutate, func(c *daemon.Config) { cfg = *c })...)
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	hc := &http.Client{Transport: tokenTransport{base: tr, token: testToken}}
	return &envdHarness{harness: h, cfg: cfg, codecs: []envdCodec{
		{"json", processconnect.NewProcessClient(hc, h.url, connect.WithProtoJSON())},
		{"binary", processconnect.NewProcessClient(hc, h.url)},
	}}
}

// json is the client the SDKs' codec speaks.
func (h *envdHarness) json() processconnect.ProcessClient { return h.codecs[0].client }

// eventStream reads a Start or Connect stream, checking the order of its
// events: start first, then data and keepalives, end last.
type eventStream struct {
	receive func() bool
	event   func() *procpb.ProcessEvent
	err     func() error
	close   func() error

	pid                 uint32
	started             bool
	stdout, stderr, pty strings.Builder
	keepalives          int
	end                 *procpb.ProcessEvent_EndEvent
}

func newEventStream[T any, PT interface {
	*T
	GetEvent() *procpb.ProcessEvent
}](st *connect.ServerStreamForClient[T]) *eventStream {
	return &eventStream{
		receive: st.Receive,
		event:   func() *procpb.ProcessEvent { return PT(st.Msg()).GetEvent() },
		err:     st.Err,
		close:   st.Close,
	}
}

// start runs req and reads the start event.
func start(t *testing.T, ctx context.Context, c processconnect.ProcessClient, req *connect.Request[procpb.StartRequest]) *eventStream {
	t.Helper()
	st, err := c.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	s := newEventStream(st)
	t.Cleanup(func() { _ = s.close() })
	s.until(t, "the start event", func() bool { return s.started })
	if s.pid == 0 {
		t.Fatal("start event without a pid")
	}
	return s
}

// attach connects to a process and reads the start event.
func attach(t *testing.T, ctx context.Context, c processconnect.ProcessClient, sel *procpb.ProcessSelector) *eventStream {
	t.Helper()
	st, err := c.Connect(ctx, connect.NewRequest(&procpb.ConnectRequest{Process: sel}))
	if err != nil {
		t.Fatal(err)
	}
	s := newEventStream(st)
	t.Cleanup(func() { _ = s.close() })
	s.until(t, "the start event", func() bool { return s.started })
	return s
}

// streamErr is the error a stream ends with before any event.
func streamErr[T any](t *testing.T, st *connect.ServerStreamForClient[T], err error) *connect.Error {
	t.Helper()
	if err == nil {
		defer st.Close()
		if st.Receive() {
			t.Fatalf("got an event, want an error: %v", st.Msg())
		}
		err = st.Err()
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		t.Fatalf("want a Connect error, got %v", err)
	}
	return ce
}

// next reads one event; false at the end of the stream.
func (s *eventStream) next(t *testing.T) bool {
	t.Helper()
	if !s.receive() {
		return false
	}
	ev := s.event()
	if _, ok := ev.GetEvent().(*procpb.ProcessEvent_Start); !ok && !s.started {
		t.Fatalf("first event is %v, want start", ev)
	}
	if s.end != nil {
		t.Fatalf("event after the end: %v", ev)
	}
	switch e := ev.GetEvent().(type) {
	case *procpb.ProcessEvent_Start:
		if s.started {
			t.Fatalf("a second start event: %v", ev)
		}
		s.started, s.pid = true, e.Start.GetPid()
	case *procpb.ProcessEvent_Data:
		switch o := e.Data.GetOutput().(type) {
		case *procpb.ProcessEvent_DataEvent_Stdout:
			s.stdout.Write(o.Stdout)
		case *procpb.ProcessEvent_DataEvent_Stderr:
			s.stderr.Write(o.Stderr)
		case *procpb.ProcessEvent_DataEvent_Pty:
			s.pty.Write(o.Pty)
		default:
			t.Fatalf("data event without output: %v", ev)
		}
	case *procpb.ProcessEvent_End:
		s.end = e.End
	case *procpb.ProcessEvent_Keepalive:
		s.keepalives++
	default:
		t.Fatalf("empty event: %v", ev)
	}
	return true
}

// until reads events until cond holds.
func (s *eventStream) until(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		if !s.next(t) {
			t.Fatalf("the stream ended (%v) before %s; stdout %q, stderr %q, pty %q", s.err(), what, s.stdout.String(), s.stderr.String(), s.pty.String())
		}
	}
}

// wait reads to the end of the stream and returns the end event.
func (s *eventStream) wait(t *testing.T) *procpb.ProcessEvent_EndEvent {
	t.Helper()
	for s.next(t) {
	}
	if err := s.err(); err != nil {
		t.Fatalf("stream: %v (stdout %q, stderr %q)", err, s.stdout.String(), s.stderr.String())
	}
	if s.end == nil {
		t.Fatal("the stream ended without an end event")
	}
	return s.end
}

func shellReq(script string) *connect.Request[procpb.StartRequest] {
	return connect.NewRequest(&procpb.StartRequest{Process: &procpb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", script}}})
}

func withStdin(req *connect.Request[procpb.StartRequest], on bool) *connect.Request[procpb.StartRequest] {
	req.Msg.Stdin = proto.Bool(on)
	return req
}

func asUser(req *connect.Request[procpb.StartRequest], name string) *connect.Request[procpb.StartRequest] {
	req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(name+":")))
	return req
}

func pidSel(pid uint32) *procpb.ProcessSelector {
	return &procpb.ProcessSelector{Selector: &procpb.ProcessSelector_Pid{Pid: pid}}
}

func tagSel(tag string) *procpb.ProcessSelector {
	return &procpb.ProcessSelector{Selector: &procpb.ProcessSelector_Tag{Tag: tag}}
}

func stdinInput(s string) *procpb.ProcessInput {
	return &procpb.ProcessInput{Input: &procpb.ProcessInput_Stdin{Stdin: []byte(s)}}
}

func ptyInput(s string) *procpb.ProcessInput {
	return &procpb.ProcessInput{Input: &procpb.ProcessInput_Pty{Pty: []byte(s)}}
}

func sendInput(ctx context.Context, c processconnect.ProcessClient, pid uint32, in *procpb.ProcessInput) error {
	_, err := c.SendInput(ctx, connect.NewRequest(&procpb.SendInputRequest{Process: pidSel(pid), Input: in}))
	return err
}

func signal(ctx context.Context, c processconnect.ProcessClient, pid uint32, sig procpb.Signal) error {
	_, err := c.SendSignal(ctx, connect.NewRequest(&procpb.SendSignalRequest{Process: pidSel(pid), Signal: sig}))
	return err
}

func closeStdin(ctx context.Context, c processconnect.ProcessClient, sel *procpb.ProcessSelector) error {
	_, err := c.CloseStdin(ctx, connect.NewRequest(&procpb.CloseStdinRequest{Process: sel}))
	return err
}

// wantCode checks that err is a Connect error of code whose message
// mentions each of words.
func wantCode(t *testing.T, err error, code connect.Code, words ...string) {
	t.Helper()
	if connect.CodeOf(err) != code {
		t.Fatalf("error %v: want code %v", err, code)
	}
	for _, w := range words {
		if !strings.Contains(err.Error(), w) {
			t.Fatalf("error %q does not mention %q", err, w)
		}
	}
}

func listed(t *testing.T, ctx context.Context, c processconnect.ProcessClient) map[uint32]*procpb.ProcessInfo {
	t.Helper()
	res, err := c.List(ctx, connect.NewRequest(&procpb.ListRequest{}))
	if err != nil {
		t.Fatal(err)
	}
	out := map[uint32]*procpb.ProcessInfo{}
	for _, p := range res.Msg.GetProcesses() {
		out[p.GetPid()] = p
	}
	return out
}

func TestEnvdStartStreamsOutputAndEnd(t *testing.T) {
	h := newEnvdHarness(t)
	var seq strings.Builder
	for i := 1; i <= 300; i++ {
		seq.WriteString(strconv.Itoa(i) + "\n")
	}
	cases := []struct {
		name           string
		req            *connect.Request[procpb.StartRequest]
		stdout, stderr string
		code           int32
		exited         bool
		status         string
	}{
		{name: "stdout and stderr", req: shellReq("echo out; echo err >&2; echo more"),
			stdout: "out\nmore\n", stderr: "err\n", exited: true, status: "exit status 0"},
		{name: "in order", req: shellReq("i=1; while [ $i -le 300 ]; do echo $i; i=$((i+1)); done"),
			stdout: seq.String(), exited: true, status: "exit status 0"},
		{name: "non-zero exit", req: shellReq("echo bad >&2; exit 3"),
			stderr: "bad\n", code: 3, exited: true, status: "exit status 3"},
		{name: "killed", req: shellReq("kill -KILL $$"), code: -1, status: "signal: killed"},
		{name: "terminated", req: shellReq("kill -TERM $$"), code: -1, status: "signal: terminated"},
		{name: "args as given, no shell", req: connect.NewRequest(&procpb.StartRequest{Process: &procpb.ProcessConfig{
			Cmd: "printf", Args: []string{"%s|", "a b", "$HOME"}}}), stdout: "a b|$HOME|", exited: true, status: "exit status 0"},
		{name: "the SDK's bash -l -c", req: connect.NewRequest(&procpb.StartRequest{Process: &procpb.ProcessConfig{
			Cmd: "/bin/bash", Args: []string{"-l", "-c", "echo $0 $((6*7))"}}, Stdin: proto.Bool(false)}),
			stdout: "/bin/bash 42\n", exited: true, status: "exit status 0"},
	}
	for _, codec := range h.codecs {
		for _, tc := range cases {
			t.Run(codec.name+"/"+tc.name, func(t *testing.T) {
				if tc.req.Msg.GetProcess().GetCmd() == "/bin/bash" {
					if _, err := os.Stat("/bin/bash"); err != nil {
						t.Skip("no /bin/bash here")
					}
				}
				s := start(t, t.Context(), codec.client, tc.req)
				end := s.wait(t)
				if s.stdout.String() != tc.stdout || s.stderr.String() != tc.stderr {
					t.Errorf("stdout %q, stderr %q; want %q, %q", s.stdout.String(), s.stderr.String(), tc.stdout, tc.stderr)
				}
				if end.GetExitCode() != tc.code || end.GetExited() != tc.exited || end.GetStatus() != tc.status {
					t.Errorf("end %v: want exit code %d, exited %v, status %q", end, tc.code, tc.exited, tc.status)
				}
				if ok := tc.code == 0 && tc.exited; ok != (end.Error == nil) || !ok && end.GetError() != tc.status {
					t.Errorf("end error %q for status %q", end.GetError(), end.GetStatus())
				}
			})
		}
	}
}

func TestEnvdStartErrors(t *testing.T) {
	h := newEnvdHarness(t)
	cases := []struct {
		name  string
		req   *procpb.StartRequest
		code  connect.Code
		words []string
	}{
		{"no cmd", &procpb.StartRequest{}, connect.CodeInvalidArgument, []string{"process.cmd"}},
		{"no such program", &procpb.StartRequest{Process: &procpb.ProcessConfig{Cmd: "/no/such/program"}},
			connect.CodeNotFound, []string{"/no/such/program"}},
		{"not in PATH", &procpb.StartRequest{Process: &procpb.ProcessConfig{Cmd: "no-such-program-here"}},
			connect.CodeNotFound, []string{"no-such-program-here"}},
		{"no such cwd", &procpb.StartRequest{Process: &procpb.ProcessConfig{Cmd: "/bin/sh", Cwd: proto.String("/no/such/dir")}},
			connect.CodeNotFound, []string{"/no/such/dir"}},
		{"empty pty size", &procpb.StartRequest{Process: &procpb.ProcessConfig{Cmd: "/bin/sh"}, Pty: &procpb.PTY{}},
			connect.CodeInvalidArgument, []string{"pty size"}},
	}
	for _, codec := range h.codecs {
		for _, tc := range cases {
			t.Run(codec.name+"/"+tc.name, func(t *testing.T) {
				st, err := codec.client.Start(t.Context(), connect.NewRequest(tc.req))
				ce := streamErr(t, st, err)
				wantCode(t, ce, tc.code, tc.words...)
			})
		}
	}
}

func TestEnvdEnvAndCwd(t *testing.T) {
	h := newEnvdHarness(t, func(c *daemon.Config) {
		c.Env = []string{"PATH=" + os.Getenv("PATH"), "SANDBOX_VAR=sandbox", "KEPT=kept"}
	})
	dir, err := filepath.EvalSymlinks(h.cfg.Dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	tmp, _ := filepath.EvalSymlinks(os.TempDir())
	cases := []struct {
		name, cwd string
		wantDir   string
	}{
		{"default: the sandbox's directory", "", dir},
		{"absolute", tmp, tmp},
		{"relative to the sandbox's directory", "sub", filepath.Join(dir, "sub")},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			req := shellReq(`echo "$SANDBOX_VAR $KEPT $FOO"; pwd -P`)
			req.Msg.Process.Envs = map[string]string{"FOO": "foo", "SANDBOX_VAR": "request"}
			if tc.cwd != "" {
				req.Msg.Process.Cwd = proto.String(tc.cwd)
			}
			s := start(t, t.Context(), h.json(), req)
			if end := s.wait(t); end.GetExitCode() != 0 {
				t.Fatalf("end %v, stderr %q", end, s.stderr.String())
			}
			if want := "request kept foo\n" + tc.wantDir + "\n"; s.stdout.String() != want {
				t.Errorf("stdout %q, want %q", s.stdout.String(), want)
			}
		})
	}
}

func TestEnvdUser(t *testing.T) {
	h := newEnvdHarness(t)
	me, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	script := `echo "$(id -u) $(id -g) $HOME $USER $LOGNAME"; pwd -P`
	t.Run("the daemon's own user by name", func(t *testing.T) {
		home, err := filepath.EvalSymlinks(me.HomeDir)
		if err != nil {
			t.Skipf("home %s of %s: %v", me.HomeDir, me.Username, err)
		}
		s := start(t, t.Context(), h.json(), asUser(shellReq(script), me.Username))
		if end := s.wait(t); end.GetExitCode() != 0 {
			t.Fatalf("end %v, stderr %q", end, s.stderr.String())
		}
		want := strings.Join([]string{me.Uid, me.Gid, me.HomeDir, me.Username, me.Username}, " ") + "\n" + home + "\n"
		if s.stdout.String() != want {
			t.Errorf("stdout %q, want %q", s.stdout.String(), want)
		}
	})
	t.Run("another user", func(t *testing.T) {
		if os.Geteuid() != 0 {
			t.Skip("only root can run commands as another user")
		}
		nobody, err := user.Lookup("nobody")
		if err != nil {
			t.Skip("no user nobody here")
		}
		want := strings.Join([]string{nobody.Uid, nobody.Gid, nobody.HomeDir, "nobody", "nobody"}, " ") + "\n"
		if fi, err := os.Stat(nobody.HomeDir); err == nil && fi.IsDir() {
			want += nobody.HomeDir + "\n"
		} else {
			want += "/\n" // no home: the root directory, not the daemon's (closed to nobody)
		}
		s := start(t, t.Context(), h.json(), asUser(shellReq(script), "nobody"))
		if end := s.wait(t); end.GetExitCode() != 0 {
			t.Fatalf("end %v, stderr %q", end, s.stderr.String())
		}
		if s.stdout.String() != want {
			t.Errorf("stdout %q, want %q", s.stdout.String(), want)
		}
		// An explicit cwd relative to a missing home is refused clearly.
		req := asUser(shellReq("true"), "nobody")
		req.Msg.Process.Cwd = proto.String("~/x")
		st, err := h.json().Start(t.Context(), req)
		wantCode(t, streamErr(t, st, err), connect.CodeNotFound, nobody.HomeDir)
	})
	t.Run("unknown user", func(t *testing.T) {
		for _, codec := range h.codecs {
			st, err := codec.client.Start(t.Context(), asUser(shellReq("true"), "no-such-user-4711"))
			wantCode(t, streamErr(t, st, err), connect.CodeInvalidArgument, `"no-such-user-4711"`, "/etc/passwd")
		}
	})
}

func TestEnvdStdin(t *testing.T) {
	h := newEnvdHarness(t)
	for _, codec := range h.codecs {
		c := codec.client
		t.Run(codec.name+"/send, stream and close", func(t *testing.T) {
			ctx := t.Context()
			s := start(t, ctx, c, withStdin(shellReq("echo ready; cat"), true))
			s.until(t, "ready", func() bool { return s.stdout.String() == "ready\n" })
			if err := sendInput(ctx, c, s.pid, stdinInput("hello\n")); err != nil {
				t.Fatal(err)
			}
			s.until(t, "the echo of SendInput", func() bool { return s.stdout.String() == "ready\nhello\n" })

			in := c.StreamInput(ctx)
			for _, m := range []*procpb.StreamInputRequest{
				{Event: &procpb.StreamInputRequest_Start{Start: &procpb.StreamInputRequest_StartEvent{Process: pidSel(s.pid)}}},
				{Event: &procpb.StreamInputRequest_Data{Data: &procpb.StreamInputRequest_DataEvent{Input: stdinInput("str")}}},
				{Event: &procpb.StreamInputRequest_Keepalive{Keepalive: &procpb.StreamInputRequest_KeepAlive{}}},
				{Event: &procpb.StreamInputRequest_Data{Data: &procpb.StreamInputRequest_DataEvent{Input: stdinInput("eam\n")}}},
			} {
				if err := in.Send(m); err != nil {
					t.Fatal(err)
				}
			}
			// The output arrives while the input stream is still open.
			s.until(t, "the echo of StreamInput", func() bool { return s.stdout.String() == "ready\nhello\nstream\n" })
			if _, err := in.CloseAndReceive(); err != nil {
				t.Fatal(err)
			}
			if err := closeStdin(ctx, c, pidSel(s.pid)); err != nil {
				t.Fatal(err)
			}
			if end := s.wait(t); end.GetExitCode() != 0 {
				t.Fatalf("end %v", end)
			}
		})
		t.Run(codec.name+"/after CloseStdin", func(t *testing.T) {
			ctx := t.Context()
			s := start(t, ctx, c, withStdin(shellReq("exec sleep 30"), true))
			if err := closeStdin(ctx, c, pidSel(s.pid)); err != nil {
				t.Fatal(err)
			}
			if err := closeStdin(ctx, c, pidSel(s.pid)); err != nil {
				t.Fatalf("closing again: %v", err)
			}
			wantCode(t, sendInput(ctx, c, s.pid, stdinInput("x")), connect.CodeFailedPrecondition, "closed")
			if err := signal(ctx, c, s.pid, procpb.Signal_SIGNAL_SIGKILL); err != nil {
				t.Fatal(err)
			}
			s.wait(t)
		})
		t.Run(codec.name+"/without stdin", func(t *testing.T) {
			ctx := t.Context()
			s := start(t, ctx, c, withStdin(shellReq("cat; echo eof"), false))
			if end := s.wait(t); end.GetExitCode() != 0 || s.stdout.String() != "eof\n" {
				t.Fatalf("end %v, stdout %q: cat should read end of file at once", end, s.stdout.String())
			}
			s = start(t, ctx, c, withStdin(shellReq("exec sleep 30"), false))
			wantCode(t, sendInput(ctx, c, s.pid, stdinInput("x")), connect.CodeFailedPrecondition, "without stdin")
			wantCode(t, closeStdin(ctx, c, pidSel(s.pid)), connect.CodeFailedPrecondition, "without stdin")
			if err := signal(ctx, c, s.pid, procpb.Signal_SIGNAL_SIGKILL); err != nil {
				t.Fatal(err)
			}
			s.wait(t)
		})
		t.Run(codec.name+"/stdin unset stays open", func(t *testing.T) {
			ctx := t.Context()
			s := start(t, ctx, c, shellReq("read x; echo got $x"))
			if err := sendInput(ctx, c, s.pid, stdinInput("it\n")); err != nil {
				t.Fatal(err)
			}
			if s.wait(t); s.stdout.String() != "got it\n" {
				t.Fatalf("stdout %q", s.stdout.String())
			}
		})
		t.Run(codec.name+"/bad input", func(t *testing.T) {
			ctx := t.Context()
			s := start(t, ctx, c, withStdin(shellReq("exec sleep 30"), true))
			wantCode(t, sendInput(ctx, c, s.pid, ptyInput("x")), connect.CodeInvalidArgument, "no terminal")
			wantCode(t, sendInput(ctx, c, s.pid, &procpb.ProcessInput{}), connect.CodeInvalidArgument, "input")
			wantCode(t, sendInput(ctx, c, 1<<31-1, stdinInput("x")), connect.CodeNotFound, "pid 2147483647")

			in := c.StreamInput(ctx)
			_ = in.Send(&procpb.StreamInputRequest{Event: &procpb.StreamInputRequest_Data{Data: &procpb.StreamInputRequest_DataEvent{Input: stdinInput("x")}}})
			_, err := in.CloseAndReceive()
			wantCode(t, err, connect.CodeInvalidArgument, "start")

			in = c.StreamInput(ctx)
			_ = in.Send(&procpb.StreamInputRequest{Event: &procpb.StreamInputRequest_Start{Start: &procpb.StreamInputRequest_StartEvent{Process: tagSel("no-such-tag")}}})
			_, err = in.CloseAndReceive()
			wantCode(t, err, connect.CodeNotFound, `"no-such-tag"`)

			if err := signal(ctx, c, s.pid, procpb.Signal_SIGNAL_SIGKILL); err != nil {
				t.Fatal(err)
			}
			s.wait(t)
		})
	}
}

func TestEnvdBackgroundAndConnect(t *testing.T) {
	h := newEnvdHarness(t)
	c := h.json()
	ctx := t.Context()
	// The client starts a command and goes away.
	bgCtx, cancel := context.WithCancel(ctx)
	s := start(t, bgCtx, c, withStdin(connect.NewRequest(&procpb.StartRequest{
		Process: &procpb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", `echo ready; read a; echo "got $a"; read b; echo "got $b"; exit 7`}},
		Tag:     proto.String("bg"),
	}), true))
	s.until(t, "ready", func() bool { return s.stdout.String() == "ready\n" })
	pid := s.pid
	cancel()
	_ = s.close()
	if _, ok := listed(t, ctx, c)[pid]; !ok {
		t.Fatalf("process %d is not listed after its client went away", pid)
	}

	// Connect by pid: the output from now on.
	bypid := attach(t, ctx, c, pidSel(pid))
	if bypid.pid != pid {
		t.Fatalf("connect by pid: start event pid %d, want %d", bypid.pid, pid)
	}
	if err := sendInput(ctx, c, pid, stdinInput("one\n")); err != nil {
		t.Fatal(err)
	}
	bypid.until(t, "got one", func() bool { return strings.Contains(bypid.stdout.String(), "got one\n") })
	if strings.Contains(bypid.stdout.String(), "ready") {
		t.Errorf("connect replayed old output: %q", bypid.stdout.String())
	}
	_ = bypid.close()

	// Connect by tag, and see it to the end.
	bytag := attach(t, ctx, c, tagSel("bg"))
	if bytag.pid != pid {
		t.Fatalf("connect by tag: pid %d, want %d", bytag.pid, pid)
	}
	if err := sendInput(ctx, c, pid, stdinInput("two\n")); err != nil {
		t.Fatal(err)
	}
	end := bytag.wait(t)
	if end.GetExitCode() != 7 || end.GetError() != "exit status 7" || bytag.stdout.String() != "got two\n" {
		t.Fatalf("end %v, stdout %q", end, bytag.stdout.String())
	}
	if _, ok := listed(t, ctx, c)[pid]; ok {
		t.Errorf("process %d is still listed after its end", pid)
	}

	// An exited process that is still remembered: start and end at once.
	again := attach(t, ctx, c, pidSel(pid))
	if end := again.wait(t); end.GetExitCode() != 7 {
		t.Fatalf("connect after the exit: %v", end)
	}
	// ... but input and signals find no process.
	wantCode(t, sendInput(ctx, c, pid, stdinInput("x")), connect.CodeNotFound, "exited")
	wantCode(t, signal(ctx, c, pid, procpb.Signal_SIGNAL_SIGKILL), connect.CodeNotFound, "exited")

	for _, codec := range h.codecs {
		for name, sel := range map[string]*procpb.ProcessSelector{
			"unknown pid": pidSel(1<<31 - 1), "unknown tag": tagSel("nope"),
		} {
			st, err := codec.client.Connect(ctx, connect.NewRequest(&procpb.ConnectRequest{Process: sel}))
			if ce := streamErr(t, st, err); ce.Code() != connect.CodeNotFound {
				t.Errorf("%s/%s: %v, want NotFound", codec.name, name, ce)
			}
		}
		st, err := codec.client.Connect(ctx, connect.NewRequest(&procpb.ConnectRequest{}))
		wantCode(t, streamErr(t, st, err), connect.CodeInvalidArgument, "pid or tag")
	}
}

func TestEnvdList(t *testing.T) {
	h := newEnvdHarness(t)
	c := h.json()
	ctx := t.Context()
	tmp := os.TempDir()
	tagged := start(t, ctx, c, connect.NewRequest(&procpb.StartRequest{
		Process: &procpb.ProcessConfig{Cmd: "sleep", Args: []string{"30"}, Envs: map[string]string{"A": "1"}, Cwd: proto.String(tmp)},
		Tag:     proto.String("t1"),
	}))
	plain := start(t, ctx, c, connect.NewRequest(&procpb.StartRequest{Process: &procpb.ProcessConfig{Cmd: "sleep", Args: []string{"31"}}}))
	v1, err := h.client.StartProcess(ctx, api.ProcessRequest{Cmd: []string{"sleep", "32"}, Tag: "v1tag"})
	if err != nil {
		t.Fatal(err)
	}

	for _, codec := range h.codecs {
		got := listed(t, ctx, codec.client)
		wants := map[uint32]*procpb.ProcessInfo{
			tagged.pid: {Pid: tagged.pid, Tag: proto.String("t1"), Config: &procpb.ProcessConfig{
				Cmd: "sleep", Args: []string{"30"}, Envs: map[string]string{"A": "1"}, Cwd: proto.String(tmp)}},
			plain.pid:      {Pid: plain.pid, Config: &procpb.ProcessConfig{Cmd: "sleep", Args: []string{"31"}, Cwd: proto.String(h.cfg.Dir)}},
			uint32(v1.PID): {Pid: uint32(v1.PID), Tag: proto.String("v1tag"), Config: &procpb.ProcessConfig{Cmd: "sleep", Args: []string{"32"}}},
		}
		for pid, want := range wants {
			if !proto.Equal(got[pid], want) {
				t.Errorf("%s: listed %v, want %v", codec.name, got[pid], want)
			}
		}
	}
	// envd's processes are v1's too.
	procs, err := h.client.Processes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(procs, func(p api.Process) bool { return uint32(p.PID) == tagged.pid && p.Tag == "t1" && p.Running }) {
		t.Errorf("v1 does not list envd's process %d: %+v", tagged.pid, procs)
	}

	// A v1 process is reachable through envd: connect and kill it.
	v1s := attach(t, ctx, c, tagSel("v1tag"))
	for _, pid := range []uint32{tagged.pid, plain.pid, uint32(v1.PID)} {
		if err := signal(ctx, c, pid, procpb.Signal_SIGNAL_SIGKILL); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []*eventStream{tagged, plain, v1s} {
		if end := s.wait(t); end.GetStatus() != "signal: killed" {
			t.Errorf("end %v", end)
		}
	}
	eventually(t, 5*time.Second, "an empty list", func() bool { return len(listed(t, ctx, c)) == 0 })
}

func TestEnvdSendSignal(t *testing.T) {
	h := newEnvdHarness(t)
	for _, codec := range h.codecs {
		c := codec.client
		t.Run(codec.name, func(t *testing.T) {
			ctx := t.Context()
			for sig, status := range map[procpb.Signal]string{
				procpb.Signal_SIGNAL_SIGTERM: "signal: terminated",
				procpb.Signal_SIGNAL_SIGKILL: "signal: killed",
			} {
				// The whole group goes: the shell and its children.
				s := start(t, ctx, c, shellReq("sleep 30 & sleep 31; wait"))
				eventually(t, 5*time.Second, "both sleeps", func() bool { return len(groupMembers(int(s.pid))) == 3 })
				if err := signal(ctx, c, s.pid, sig); err != nil {
					t.Fatal(err)
				}
				if end := s.wait(t); end.GetStatus() != status || end.GetExitCode() != -1 || end.GetExited() {
					t.Errorf("%v: end %v, want status %q", sig, end, status)
				}
				eventually(t, 5*time.Second, "the group gone", func() bool { return len(groupMembers(int(s.pid))) == 0 })
			}
			s := start(t, ctx, c, shellReq("exec sleep 30"))
			wantCode(t, signal(ctx, c, s.pid, procpb.Signal_SIGNAL_UNSPECIFIED), connect.CodeInvalidArgument, "signal")
			wantCode(t, signal(ctx, c, s.pid, procpb.Signal(99)), connect.CodeInvalidArgument, "99")
			wantCode(t, signal(ctx, c, 1<<31-1, procpb.Signal_SIGNAL_SIGKILL), connect.CodeNotFound, "pid")
			_, err := c.SendSignal(ctx, connect.NewRequest(&procpb.SendSignalRequest{Process: tagSel(""), Signal: procpb.Signal_SIGNAL_SIGKILL}))
			wantCode(t, err, connect.CodeInvalidArgument, "tag")
			if err := signal(ctx, c, s.pid, procpb.Signal_SIGNAL_SIGKILL); err != nil {
				t.Fatal(err)
			}
			s.wait(t)
		})
	}
}

func TestEnvdPTY(t *testing.T) {
	if _, err := os.Stat("/dev/ptmx"); err != nil {
		t.Skip("no /dev/ptmx here")
	}
	h := newEnvdHarness(t)
	for _, codec := range h.codecs {
		c := codec.client
		t.Run(codec.name, func(t *testing.T) {
			ctx := t.Context()
			req := connect.NewRequest(&procpb.StartRequest{
				Process: &procpb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", `test -t 0 && test -t 1 && echo tty; stty size; read x; stty size; echo "x=$x"`}},
				Pty:     &procpb.PTY{Size: &procpb.PTY_Size{Cols: 100, Rows: 30}},
			})
			s := start(t, ctx, c, req)
			s.until(t, "the first size", func() bool { return strings.Contains(s.pty.String(), "30 100\r\n") })
			if !strings.HasPrefix(s.pty.String(), "tty\r\n") {
				t.Errorf("pty output %q: stdin and stdout should be a terminal", s.pty.String())
			}
			if _, err := c.Update(ctx, connect.NewRequest(&procpb.UpdateRequest{
				Process: pidSel(s.pid), Pty: &procpb.PTY{Size: &procpb.PTY_Size{Cols: 120, Rows: 40}},
			})); err != nil {
				t.Fatal(err)
			}
			_, err := c.Update(ctx, connect.NewRequest(&procpb.UpdateRequest{Process: pidSel(s.pid)}))
			wantCode(t, err, connect.CodeInvalidArgument, "pty.size")
			wantCode(t, closeStdin(ctx, c, pidSel(s.pid)), connect.CodeFailedPrecondition, "terminal")
			if err := sendInput(ctx, c, s.pid, ptyInput("g")); err != nil {
				t.Fatal(err)
			}
			// stdin input reaches the terminal too.
			if err := sendInput(ctx, c, s.pid, stdinInput("o\n")); err != nil {
				t.Fatal(err)
			}
			end := s.wait(t)
			if end.GetExitCode() != 0 {
				t.Fatalf("end %v, pty %q", end, s.pty.String())
			}
			if out := s.pty.String(); !strings.Contains(out, "go\r\n40 120\r\nx=go\r\n") || s.stdout.Len()+s.stderr.Len() != 0 {
				t.Errorf("pty %q (stdout %q, stderr %q): want the echoed input, the new size and x=go",
					out, s.stdout.String(), s.stderr.String())
			}
			_, err = c.Update(ctx, connect.NewRequest(&procpb.UpdateRequest{
				Process: pidSel(s.pid), Pty: &procpb.PTY{Size: &procpb.PTY_Size{Cols: 1, Rows: 1}},
			}))
			wantCode(t, err, connect.CodeNotFound, "exited")

			plain := start(t, ctx, c, shellReq("exec sleep 30"))
			_, err = c.Update(ctx, connect.NewRequest(&procpb.UpdateRequest{
				Process: pidSel(plain.pid), Pty: &procpb.PTY{Size: &procpb.PTY_Size{Cols: 1, Rows: 1}},
			}))
			wantCode(t, err, connect.CodeFailedPrecondition, "no terminal")
			if err := signal(ctx, c, plain.pid, procpb.Signal_SIGNAL_SIGKILL); err != nil {
				t.Fatal(err)
			}
			plain.wait(t)
		})
	}
}

func TestEnvdKeepalive(t *testing.T) {
	h := newEnvdHarness(t)
	c := h.json()
	ctx := t.Context()
	req := shellReq("exec sleep 30")
	req.Header().Set("Keepalive-Ping-Interval", "0.05")
	s := start(t, ctx, c, req)
	s.until(t, "keepalives on Start", func() bool { return s.keepalives >= 3 })

	creq := connect.NewRequest(&procpb.ConnectRequest{Process: pidSel(s.pid)})
	creq.Header().Set("Keepalive-Ping-Interval", "0.05")
	st, err := c.Connect(ctx, creq)
	if err != nil {
		t.Fatal(err)
	}
	cs := newEventStream(st)
	defer cs.close()
	cs.until(t, "keepalives on Connect", func() bool { return cs.keepalives >= 3 })

	if err := signal(ctx, c, s.pid, procpb.Signal_SIGNAL_SIGKILL); err != nil {
		t.Fatal(err)
	}
	s.wait(t)
	cs.wait(t)
}

func TestEnvdTimeoutKills(t *testing.T) {
	h := newEnvdHarness(t)
	c := h.json()
	ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancel()
	s := start(t, ctx, c, shellReq("exec sleep 30"))
	for s.next(t) {
	}
	// The kill and the caller's deadline coincide: the stream ends with
	// either.
	if s.end == nil && connect.CodeOf(s.err()) != connect.CodeDeadlineExceeded {
		t.Fatalf("stream ended with %v, want deadline_exceeded or the end", s.err())
	}
	eventually(t, 5*time.Second, "the process killed at the deadline", func() bool {
		procs, err := h.client.Processes(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(procs, func(p api.Process) bool { return uint32(p.PID) == s.pid })
		return i >= 0 && !procs[i].Running && procs[i].TimedOut && procs[i].Signal == "KILL"
	})
	// Connecting to it afterwards reports the timeout.
	again := attach(t, t.Context(), c, pidSel(s.pid))
	if end := again.wait(t); !strings.Contains(end.GetError(), "timeout") {
		t.Errorf("end %v: the error should tell of the timeout", end)
	}
}

func TestEnvdAuth(t *testing.T) {
	h := newEnvdHarness(t)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	for name, hc := range map[string]*http.Client{
		"no token":    {Transport: tr},
		"wrong token": {Transport: tokenTransport{base: tr, token: "wrong"}},
	} {
		for _, useJSON := range []bool{true, false} {
			var opts []connect.ClientOption
			if useJSON {
				opts = append(opts, connect.WithProtoJSON())
			}
			c := processconnect.NewProcessClient(hc, h.url, opts...)
			_, err := c.List(t.Context(), connect.NewRequest(&procpb.ListRequest{}))
			wantCode(t, err, connect.CodeUnauthenticated, "X-Access-Token")
			st, err := c.Start(t.Context(), shellReq("echo should not run"))
			if ce := streamErr(t, st, err); ce.Code() != connect.CodeUnauthenticated {
				t.Errorf("%s: Start: %v", name, ce)
			}
		}
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, h.url+processconnect.ProcessListProcedure, strings.NewReader("{}"))
	req.Header.Set("Content-Type", "application/json")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("status %d, want 401", resp.StatusCode)
	}
}

func TestEnvdProcessLimit(t *testing.T) {
	h := newEnvdHarness(t, func(c *daemon.Config) { c.MaxProcesses = 2 })
	c := h.json()
	ctx := t.Context()
	a := start(t, ctx, c, shellReq("exec sleep 30"))
	b := start(t, ctx, c, shellReq("exec sleep 30"))
	for _, codec := range h.codecs {
		st, err := codec.client.Start(ctx, shellReq("echo should not run"))
		wantCode(t, streamErr(t, st, err), connect.CodeResourceExhausted, "2 processes")
	}
	for _, s := range []*eventStream{a, b} {
		if err := signal(ctx, c, s.pid, procpb.Signal_SIGNAL_SIGKILL); err != nil {
			t.Fatal(err)
		}
		s.wait(t)
	}
	// The slots come back once the processes are gone.
	eventually(t, 5*time.Second, "a free slot", func() bool {
		st, err := c.Start(ctx, shellReq("true"))
		if err != nil {
			return false
		}
		defer st.Close()
		return st.Receive()
	})
}

// TestEnvdNoLeaks runs streams that end every way (end, client gone,
// deadline, errors) and checks that once the daemon is shut down no
// goroutine or descriptor is left.
func TestEnvdNoLeaks(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	fds := func() int {
		entries, _ := os.ReadDir("/proc/self/fd")
		return len(entries)
	}
	before := fds()
	t.Cleanup(func() { // runs last
		goleak.VerifyNone(t, ignore)
		eventually(t, 5*time.Second, "the descriptors closed", func() bool { return fds() <= before })
	})
	h := newEnvdHarness(t)
	c := h.json()
	ctx := t.Context()

	// To the end, with stdin and a terminal.
	s := start(t, ctx, c, withStdin(shellReq("cat"), true))
	if err := sendInput(ctx, c, s.pid, stdinInput("x")); err != nil {
		t.Fatal(err)
	}
	if err := closeStdin(ctx, c, pidSel(s.pid)); err != nil {
		t.Fatal(err)
	}
	s.wait(t)
	if _, err := os.Stat("/dev/ptmx"); err == nil {
		p := start(t, ctx, c, connect.NewRequest(&procpb.StartRequest{
			Process: &procpb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "read x"}},
			Pty:     &procpb.PTY{Size: &procpb.PTY_Size{Cols: 80, Rows: 24}},
		}))
		if err := sendInput(ctx, c, p.pid, ptyInput("x\n")); err != nil {
			t.Fatal(err)
		}
		p.wait(t)
	}
	// A client that goes away from Start and Connect; a process left
	// running for Shutdown, with a write it never reads cut off by the
	// caller's deadline.
	gone, cancel := context.WithCancel(ctx)
	bg := start(t, gone, c, withStdin(shellReq("exec sleep 30"), true))
	attach(t, gone, c, pidSel(bg.pid))
	wctx, wcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer wcancel()
	wantCode(t, sendInput(wctx, c, bg.pid, stdinInput(strings.Repeat("x", 1<<20))), connect.CodeDeadlineExceeded)
	// That write has given up: the next one (empty) does not wait for it.
	if err := sendInput(ctx, c, bg.pid, stdinInput("")); err != nil {
		t.Fatal(err)
	}
	cancel()
	// A failed start.
	st, err := c.Start(ctx, asUser(shellReq("true"), "no-such-user-4711"))
	streamErr(t, st, err)
}

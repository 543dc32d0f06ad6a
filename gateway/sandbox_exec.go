package gateway

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"

	"connectrpc.com/connect"

	daemonclient "github.com/sandman-dev/sandman/daemon/client"
	procpb "github.com/sandman-dev/sandman/daemon/envd/spec/process"
	"github.com/sandman-dev/sandman/daemon/envd/spec/process/processconnect"
)

// sandboxExec runs commands in one of the gateway's own sandboxes (a
// template's build sandbox, or a new sandbox's start command) through its
// daemon, with the token the gateway derives for it: envd's process
// service, which runs a command as a named user, and the v1 API for
// archives.
type sandboxExec struct {
	addr  string // host:port of the daemon
	token string
	hc    *http.Client
	procs processconnect.ProcessClient
}

func (g *Gateway) sandboxExec(podIP, token string) *sandboxExec {
	addr := net.JoinHostPort(podIP, strconv.Itoa(daemonPort))
	hc := &http.Client{Transport: g.cfg.Transport}
	return &sandboxExec{addr: addr, token: token, hc: hc, procs: processconnect.NewProcessClient(hc, "http://"+addr)}
}

// command is one command to run: a shell line, as a user ("" for the
// image's own), with variables over the sandbox's and a directory (""
// for the user's home).
type command struct {
	Shell string
	User  string
	Env   map[string]string
	Cwd   string
}

// shellWrapper runs $1 with bash where the image has it (what E2B's steps
// and start commands assume), else with sh.
const shellWrapper = `if command -v bash >/dev/null 2>&1; then exec bash -c "$1"; fi; exec sh -c "$1"`

func (x *sandboxExec) startRequest(c command) *connect.Request[procpb.StartRequest] {
	cfg := &procpb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", shellWrapper, "sh", c.Shell}, Envs: c.Env}
	if c.Cwd != "" {
		cwd := c.Cwd
		cfg.Cwd = &cwd
	}
	no := false
	req := connect.NewRequest(&procpb.StartRequest{Process: cfg, Stdin: &no})
	req.Header().Set("X-Access-Token", x.token)
	if c.User != "" {
		req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(c.User+":")))
	}
	return req
}

// run runs c to its end; line gets each line of its output as it comes
// (stderr true for the error stream). A command that could not start is
// an error; one that exits non-zero is not (its exit code says so).
func (x *sandboxExec) run(ctx context.Context, c command, line func(text string, stderr bool)) (int, error) {
	stream, err := x.procs.Start(ctx, x.startRequest(c))
	if err != nil {
		return -1, fmt.Errorf("start `%s`: %w", c.Shell, err)
	}
	defer stream.Close()
	var out, errOut lineSplitter
	out.emit = func(s string) { line(s, false) }
	errOut.emit = func(s string) { line(s, true) }
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			out.write(d.GetStdout())
			errOut.write(d.GetStderr())
		}
		if end := ev.GetEnd(); end != nil {
			out.flush()
			errOut.flush()
			if !end.GetExited() && end.GetError() != "" {
				return -1, fmt.Errorf("`%s`: %s", c.Shell, end.GetError())
			}
			return int(end.GetExitCode()), nil
		}
	}
	if err := stream.Err(); err != nil {
		return -1, fmt.Errorf("`%s`: %w", c.Shell, err)
	}
	return -1, fmt.Errorf("`%s`: the sandbox's daemon ended the stream before the command ended", c.Shell)
}

// output runs c and returns its output (stdout and stderr, interleaved)
// and exit code.
func (x *sandboxExec) output(ctx context.Context, c command) (string, int, error) {
	var b bytes.Buffer
	code, err := x.run(ctx, c, func(s string, _ bool) {
		if b.Len() < 64<<10 {
			b.WriteString(s)
			b.WriteByte('\n')
		}
	})
	return b.String(), code, err
}

// start starts c in the background and returns once it runs: the process
// outlives the call (the daemon keeps it after the stream ends).
func (x *sandboxExec) start(ctx context.Context, c command) (uint32, error) {
	stream, err := x.procs.Start(ctx, x.startRequest(c))
	if err != nil {
		return 0, fmt.Errorf("start `%s`: %w", c.Shell, err)
	}
	defer stream.Close()
	for stream.Receive() {
		if s := stream.Msg().GetEvent().GetStart(); s != nil {
			return s.GetPid(), nil
		}
	}
	if err := stream.Err(); err != nil {
		return 0, fmt.Errorf("start `%s`: %w", c.Shell, err)
	}
	return 0, fmt.Errorf("start `%s`: the sandbox's daemon ended the stream before the process started", c.Shell)
}

// extractTar unpacks a tar archive into dir in the sandbox (as the
// image's own user: dir must be writable to it).
func (x *sandboxExec) extractTar(ctx context.Context, dir string, r io.Reader) error {
	c, err := daemonclient.New(x.addr, daemonclient.WithToken(x.token), daemonclient.WithHTTPClient(x.hc))
	if err != nil {
		return err
	}
	_, err = c.UploadTar(ctx, dir, r)
	return err
}

// lineSplitter cuts a stream of output into lines.
type lineSplitter struct {
	buf  []byte
	emit func(string)
}

// maxLineBytes cuts a line that never ends.
const maxLineBytes = 4096

func (l *lineSplitter) write(b []byte) {
	l.buf = append(l.buf, b...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			if len(l.buf) >= maxLineBytes {
				l.emit(string(l.buf[:maxLineBytes]))
				l.buf = append(l.buf[:0], l.buf[maxLineBytes:]...)
				continue
			}
			return
		}
		l.emit(string(bytes.TrimSuffix(l.buf[:i], []byte("\r"))))
		l.buf = l.buf[i+1:]
	}
}

func (l *lineSplitter) flush() {
	if len(l.buf) > 0 {
		l.emit(string(l.buf))
		l.buf = nil
	}
}

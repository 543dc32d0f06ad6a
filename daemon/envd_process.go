package daemon

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	procpb "github.com/sandman-dev/sandman/daemon/envd/spec/process"
	"github.com/sandman-dev/sandman/daemon/envd/spec/process/processconnect"
	"github.com/sandman-dev/sandman/daemon/internal/process"
	"github.com/sandman-dev/sandman/daemon/internal/sandboxuser"
)

// envdProcess serves envd's process service. Its processes live in the
// daemon's one process table beside v1's background processes: they hold
// process slots, count as running, are killed at shutdown, and show up in
// GET /v1/processes; envd's List, Connect, input and signals reach v1's
// background processes (and the main process) too.
//
// As in envd, a process outlives the stream that started it: a client that
// goes away leaves it running, and Connect re-attaches by pid or tag. The
// stream's deadline (Connect-Timeout-Ms, the SDKs' timeoutMs) is the
// process's own: it is KILLed when the deadline passes.
type envdProcess struct {
	processconnect.UnimplementedProcessHandler
	s *Server
}

var _ processconnect.ProcessHandler = (*envdProcess)(nil)

// envdMeta is what envd keeps about a process it started.
type envdMeta struct {
	// config is the request's, with the directory it runs in (for List).
	config *procpb.ProcessConfig
	// tty: the process runs on a pseudo-terminal; process.stdin is a
	// descriptor of its master, for input and resizes.
	tty bool
	// stdin: started with stdin open (always true with a terminal).
	stdin bool
	// user it runs as ("" for the daemon's own).
	user string
}

// envdMetaOf is what envd keeps about p (nil for a process v1 started).
func envdMetaOf(p *process.Process) *envdMeta {
	m, _ := p.Meta.(*envdMeta)
	return m
}

// isTTY reports whether the process runs on a terminal.
func (m *envdMeta) isTTY() bool { return m != nil && m.tty }

// noStdin reports whether envd started the process without stdin.
func (m *envdMeta) noStdin() bool { return m != nil && !m.stdin }

const (
	// keepaliveHeader carries the interval, in seconds, at which a quiet
	// stream gets a keepalive event (the SDKs send 50).
	keepaliveHeader = "Keepalive-Ping-Interval"
	// defaultKeepalive applies when the header is missing or malformed.
	defaultKeepalive = 50 * time.Second
	// minKeepalive bounds how often a client may ask for keepalives.
	minKeepalive = 10 * time.Millisecond
)

// Start runs a process and streams its events: start{pid}, its output as
// it comes, end{exit code, status}, and keepalives on a quiet stream.
func (e *envdProcess) Start(ctx context.Context, req *connect.Request[procpb.StartRequest], stream *connect.ServerStream[procpb.StartResponse]) error {
	s := e.s
	m := req.Msg
	cmd, meta, err := s.envdCommand(envdUser(ctx), m.GetProcess())
	if err != nil {
		return asConnectError(err)
	}
	meta.tty = m.Pty != nil
	// Older SDKs do not send stdin and expect it open, as older agents kept it.
	meta.stdin = meta.tty || m.Stdin == nil || m.GetStdin()
	var cols, rows uint16
	if meta.tty {
		if cols, rows, err = ptySize(m.GetPty()); err != nil {
			return err
		}
	}
	var timeout time.Duration
	if dl, ok := ctx.Deadline(); ok {
		if timeout = time.Until(dl); timeout <= 0 {
			return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the request's deadline passed before the process started"))
		}
	}
	spawn := func() (*process.Proc, error) {
		if meta.tty {
			return s.procs.SpawnPTY(cmd, cols, rows)
		}
		return s.procs.Spawn(cmd, meta.stdin)
	}
	p, err := s.procs.Track(process.TrackSpec{Argv: cmd.Args, Tag: m.GetTag(), Timeout: timeout, Meta: meta}, spawn)
	if err != nil {
		return asConnectError(err)
	}
	s.log.Debug("envd process started", "pid", p.PID, "id", p.ID, "tag", p.Tag, "user", meta.user, "pty", meta.tty, "timeout", timeout)
	send := func(ev *procpb.ProcessEvent) error { return stream.Send(&procpb.StartResponse{Event: ev}) }
	if err := send(startEvent(p)); err != nil {
		return err
	}
	return s.envdFollow(ctx, p, 0, keepaliveInterval(req.Header()), send)
}

// Connect attaches to a process by pid or tag: start{pid}, its output from
// now on, then end. A process that has exited (and is still remembered)
// gets start and end at once.
func (e *envdProcess) Connect(ctx context.Context, req *connect.Request[procpb.ConnectRequest], stream *connect.ServerStream[procpb.ConnectResponse]) error {
	p, err := e.s.envdFind(req.Msg.GetProcess(), true)
	if err != nil {
		return err
	}
	offset := p.Out.Total()
	send := func(ev *procpb.ProcessEvent) error { return stream.Send(&procpb.ConnectResponse{Event: ev}) }
	if err := send(startEvent(p)); err != nil {
		return err
	}
	return e.s.envdFollow(ctx, p, offset, keepaliveInterval(req.Header()), send)
}

// List lists the running processes: envd's with their configuration, v1's
// background processes with their command line.
func (e *envdProcess) List(ctx context.Context, req *connect.Request[procpb.ListRequest]) (*connect.Response[procpb.ListResponse], error) {
	var running []*process.Process
	for _, p := range e.s.procs.Table.Snapshot() {
		if !p.HasExited() {
			running = append(running, p)
		}
	}
	out := &procpb.ListResponse{Processes: make([]*procpb.ProcessInfo, 0, len(running))}
	for _, p := range running {
		info := &procpb.ProcessInfo{Pid: uint32(p.PID)}
		if m := envdMetaOf(p); m != nil {
			info.Config = proto.CloneOf(m.config)
		} else if len(p.Cmd) > 0 {
			info.Config = &procpb.ProcessConfig{Cmd: p.Cmd[0], Args: p.Cmd[1:]}
		}
		if p.Tag != "" {
			info.Tag = proto.String(p.Tag)
		}
		out.Processes = append(out.Processes, info)
	}
	return connect.NewResponse(out), nil
}

// SendInput writes one chunk to a process's stdin or terminal.
func (e *envdProcess) SendInput(ctx context.Context, req *connect.Request[procpb.SendInputRequest]) (*connect.Response[procpb.SendInputResponse], error) {
	p, err := e.s.envdFind(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, err
	}
	if err := envdWrite(ctx, p, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&procpb.SendInputResponse{}), nil
}

// StreamInput writes a client stream of chunks to a process: a start event
// naming it first, then data events (keepalives are ignored). The end of
// the stream leaves stdin open; CloseStdin closes it.
func (e *envdProcess) StreamInput(ctx context.Context, stream *connect.ClientStream[procpb.StreamInputRequest]) (*connect.Response[procpb.StreamInputResponse], error) {
	var p *process.Process
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *procpb.StreamInputRequest_Start:
			if p != nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("a second start event: an input stream goes to one process"))
			}
			var err error
			if p, err = e.s.envdFind(ev.Start.GetProcess(), false); err != nil {
				return nil, err
			}
		case *procpb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("data before the start event: send start{process} first"))
			}
			if err := envdWrite(ctx, p, ev.Data.GetInput()); err != nil {
				return nil, err
			}
		case *procpb.StreamInputRequest_Keepalive:
		default:
			return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("an empty input event: set start, data or keepalive"))
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&procpb.StreamInputResponse{}), nil
}

// CloseStdin closes a process's stdin, so that it reads end of file.
// Closing it again succeeds.
func (e *envdProcess) CloseStdin(ctx context.Context, req *connect.Request[procpb.CloseStdinRequest]) (*connect.Response[procpb.CloseStdinResponse], error) {
	p, err := e.s.envdFind(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, err
	}
	if envdMetaOf(p).isTTY() {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"process %d runs on a terminal, whose input cannot be closed: send ^D (0x04) as pty input to end a line discipline read, or a signal", p.PID))
	}
	if envdMetaOf(p).noStdin() {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"process %d was started without stdin (it reads /dev/null); start it with stdin: true to send input", p.PID))
	}
	p.CloseStdin()
	return connect.NewResponse(&procpb.CloseStdinResponse{}), nil
}

// SendSignal sends a signal (SIGTERM or SIGKILL in the protocol; any other
// valid number is passed on) to the process's group.
func (e *envdProcess) SendSignal(ctx context.Context, req *connect.Request[procpb.SendSignalRequest]) (*connect.Response[procpb.SendSignalResponse], error) {
	p, err := e.s.envdFind(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, err
	}
	n := int(req.Msg.GetSignal())
	if n == int(procpb.Signal_SIGNAL_UNSPECIFIED) {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("signal is required: SIGNAL_SIGTERM (15) or SIGNAL_SIGKILL (9)"))
	}
	if n < 1 || n > 64 {
		return nil, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("signal %d is out of range 1-64", n))
	}
	if err := e.s.procs.SignalGroup(p.PID, syscall.Signal(n)); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %d has exited", p.PID))
		}
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("signal process %d: %w", p.PID, err))
	}
	return connect.NewResponse(&procpb.SendSignalResponse{}), nil
}

// Update resizes a process's terminal; the kernel tells its foreground
// process group with SIGWINCH.
func (e *envdProcess) Update(ctx context.Context, req *connect.Request[procpb.UpdateRequest]) (*connect.Response[procpb.UpdateResponse], error) {
	p, err := e.s.envdFind(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, err
	}
	if req.Msg.Pty == nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("nothing to update: set pty.size"))
	}
	cols, rows, err := ptySize(req.Msg.GetPty())
	if err != nil {
		return nil, err
	}
	if !envdMetaOf(p).isTTY() {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no terminal to resize: start it with pty", p.PID))
	}
	tty, _ := p.Stdin()
	if tty == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %d has exited", p.PID))
	}
	if err := process.SetWinsize(tty, cols, rows); err != nil {
		if errors.Is(err, os.ErrClosed) {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %d has exited", p.PID))
		}
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("resize the terminal of process %d: %w", p.PID, err))
	}
	return connect.NewResponse(&procpb.UpdateResponse{}), nil
}

// envdCommand builds the command of a ProcessConfig for user ("" for the
// daemon's own): cmd with args, looked up in PATH unless it has a slash;
// the sandbox's environment, the user's HOME, USER and LOGNAME, and envs
// over them; the working directory cwd resolved for the user
// (sandboxuser.User.Resolve), by default the user's home or, without a
// user, the sandbox's directory.
func (s *Server) envdCommand(user string, cfg *procpb.ProcessConfig) (*exec.Cmd, *envdMeta, error) {
	if cfg.GetCmd() == "" {
		return nil, nil, connect.NewError(connect.CodeInvalidArgument, errors.New(
			"process.cmd is required: the program to run, e.g. /bin/bash with args [-l, -c, <command>]"))
	}
	a := s.access.Load()
	u, err := sandboxuser.For(user, a.env, a.dir)
	if errors.Is(err, sandboxuser.ErrUnknown) {
		return nil, nil, connect.NewError(connect.CodeInvalidArgument, err)
	} else if err != nil {
		return nil, nil, asConnectError(err)
	}
	env := map[string]string{}
	if user != "" {
		env["HOME"], env["USER"], env["LOGNAME"] = u.Home, u.Name, u.Name
		if fi, err := os.Stat(u.Home); err != nil || !fi.IsDir() {
			// Accounts such as nobody have no home; the daemon's directory
			// may be closed to them.
			u.Base = "/"
		}
	}
	for k, v := range cfg.GetEnvs() {
		env[k] = v
	}
	dir, err := u.Resolve(cfg.GetCwd())
	if err != nil {
		return nil, nil, asConnectError(err)
	}
	cmd, err := s.command(commandSpec{argv: append([]string{cfg.GetCmd()}, cfg.GetArgs()...), env: env, cwd: dir})
	if err != nil {
		return nil, nil, err
	}
	if user != "" {
		cred, err := u.Credential()
		if err != nil {
			return nil, nil, asConnectError(err)
		}
		cmd.SysProcAttr.Credential = cred
	}
	config := proto.CloneOf(cfg)
	config.Cwd = proto.String(dir)
	return cmd, &envdMeta{config: config, user: user}, nil
}

// ptySize checks a PTY's size.
func ptySize(p *procpb.PTY) (cols, rows uint16, err error) {
	sz := p.GetSize()
	c, r := sz.GetCols(), sz.GetRows()
	if c == 0 || r == 0 || c > math.MaxUint16 || r > math.MaxUint16 {
		return 0, 0, connect.NewError(connect.CodeInvalidArgument, fmt.Errorf(
			"pty size %dx%d: want cols and rows between 1 and %d", c, r, math.MaxUint16))
	}
	return uint16(c), uint16(r), nil
}

// envdFind resolves a selector to a process of the table: a running one
// (the newest, should a tag name several), or, with exited and none
// running, the newest that has exited. Unknown and (without exited) exited
// processes are NotFound, as envd has them.
func (s *Server) envdFind(sel *procpb.ProcessSelector, exited bool) (*process.Process, error) {
	var match func(*process.Process) bool
	var what string
	switch v := sel.GetSelector().(type) {
	case *procpb.ProcessSelector_Pid:
		match = func(p *process.Process) bool { return p.PID == int(v.Pid) }
		what = fmt.Sprintf("pid %d", v.Pid)
	case *procpb.ProcessSelector_Tag:
		if v.Tag == "" {
			return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process.tag is empty: name a process by pid or tag"))
		}
		match = func(p *process.Process) bool { return p.Tag == v.Tag }
		what = fmt.Sprintf("tag %q", v.Tag)
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process is required: select a process by pid or tag"))
	}
	var best *process.Process
	bestRunning := false
	for _, p := range s.procs.Table.Snapshot() {
		if !match(p) {
			continue
		}
		running := !p.HasExited()
		switch {
		case best == nil, running && !bestRunning:
		case running == bestRunning && p.Started.After(best.Started):
		default:
			continue
		}
		best, bestRunning = p, running
	}
	switch {
	case best == nil:
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no process with %s (List shows the running ones)", what))
	case !bestRunning && !exited:
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("the process with %s has exited", what))
	}
	return best, nil
}

// envdWrite writes input to a process's stdin (or terminal). A write the
// process does not read blocks until ctx ends.
func envdWrite(ctx context.Context, p *process.Process, input *procpb.ProcessInput) error {
	var data []byte
	tty := envdMetaOf(p).isTTY()
	switch v := input.GetInput().(type) {
	case *procpb.ProcessInput_Stdin:
		data = v.Stdin
	case *procpb.ProcessInput_Pty:
		if !tty {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("process %d has no terminal: send its input as stdin", p.PID))
		}
		data = v.Pty
	default:
		return connect.NewError(connect.CodeInvalidArgument, errors.New("input is required: set stdin or pty"))
	}
	p.InputMu.Lock()
	defer p.InputMu.Unlock()
	in, exited := p.Stdin()
	switch {
	case exited:
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("process %d has exited", p.PID))
	case in == nil && envdMetaOf(p).noStdin():
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"process %d was started without stdin (it reads /dev/null); start it with stdin: true to send input", p.PID))
	case in == nil:
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("the stdin of process %d is closed", p.PID))
	case len(data) == 0:
		return nil
	}
	_ = in.SetWriteDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { _ = in.SetWriteDeadline(time.Now()) })
	defer stop()
	if _, err := in.Write(data); err != nil {
		switch {
		case ctx.Err() != nil:
			return connect.NewError(connect.CodeOf(ctx.Err()), fmt.Errorf("write to process %d: the process did not read its input before the call ended", p.PID))
		case errors.Is(err, os.ErrClosed), errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.EIO):
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("the stdin of process %d closed while writing (it exited or closed it)", p.PID))
		}
		return connect.NewError(connect.CodeInternal, fmt.Errorf("write to process %d: %w", p.PID, err))
	}
	return nil
}

// envdFollow sends p's output from offset on, as it comes, then its end;
// a keepalive goes out whenever nothing was sent for the keepalive
// interval. It returns when the end is sent, sending fails, or ctx ends
// (the process lives on).
func (s *Server) envdFollow(ctx context.Context, p *process.Process, offset int64, keepalive time.Duration, send func(*procpb.ProcessEvent) error) error {
	tty := envdMetaOf(p).isTTY()
	timer := time.NewTimer(keepalive)
	defer timer.Stop()
	for {
		chunks, dropped, next, closed, changed := p.Out.Read(offset)
		if dropped > 0 {
			s.log.Warn("envd stream fell behind the retained output", "pid", p.PID, "dropped_bytes", dropped)
		}
		for _, c := range chunks {
			if err := send(dataEvent(c, tty)); err != nil {
				return err
			}
		}
		offset = next
		if closed {
			return send(endEvent(p))
		}
		if len(chunks) > 0 {
			timer.Reset(keepalive)
		}
		select {
		case <-changed:
		case <-timer.C:
			if err := send(&procpb.ProcessEvent{Event: &procpb.ProcessEvent_Keepalive{Keepalive: &procpb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
			timer.Reset(keepalive)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// keepaliveInterval reads the client's keepalive interval (seconds).
func keepaliveInterval(h http.Header) time.Duration {
	secs, err := strconv.ParseFloat(strings.TrimSpace(h.Get(keepaliveHeader)), 64)
	if err != nil || !(secs > 0) || math.IsInf(secs, 0) {
		return defaultKeepalive
	}
	secs = min(secs, (24 * time.Hour).Seconds())
	return max(time.Duration(secs*float64(time.Second)), minKeepalive)
}

func startEvent(p *process.Process) *procpb.ProcessEvent {
	return &procpb.ProcessEvent{Event: &procpb.ProcessEvent_Start{Start: &procpb.ProcessEvent_StartEvent{Pid: uint32(p.PID)}}}
}

func dataEvent(c process.Chunk, tty bool) *procpb.ProcessEvent {
	d := &procpb.ProcessEvent_DataEvent{}
	switch {
	case tty:
		d.Output = &procpb.ProcessEvent_DataEvent_Pty{Pty: c.Data}
	case c.Stream == process.Stderr:
		d.Output = &procpb.ProcessEvent_DataEvent_Stderr{Stderr: c.Data}
	default:
		d.Output = &procpb.ProcessEvent_DataEvent_Stdout{Stdout: c.Data}
	}
	return &procpb.ProcessEvent{Event: &procpb.ProcessEvent_Data{Data: d}}
}

// endEvent is a process's end as envd reports it, after Go's
// os.ProcessState: exit_code is -1 and exited false when a signal ended
// it; status reads "exit status 1" or "signal: killed"; error is set
// unless it exited 0.
func endEvent(p *process.Process) *procpb.ProcessEvent {
	state := p.State()
	st, timedOut := state.Status, state.TimedOut
	end := &procpb.ProcessEvent_EndEvent{ExitCode: -1}
	switch {
	case st.Signal != "":
		end.Status = "signal: " + syscall.Signal(st.Code-128).String()
	case st.Code < 0:
		end.Status = "unknown: the daemon could not collect the exit status"
	default:
		end.ExitCode, end.Exited = int32(st.Code), true
		end.Status = "exit status " + strconv.Itoa(st.Code)
	}
	if !end.Exited || end.ExitCode != 0 {
		msg := end.Status
		if timedOut {
			msg += " (the command's timeout ran out; the SDKs' timeoutMs: 0 sets none)"
		}
		end.Error = &msg
	}
	return &procpb.ProcessEvent{Event: &procpb.ProcessEvent_End{End: end}}
}

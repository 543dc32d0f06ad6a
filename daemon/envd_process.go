package daemon

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	"github.com/sandman-dev/sandman/daemon/api"
	procpb "github.com/sandman-dev/sandman/daemon/envd/spec/process"
	"github.com/sandman-dev/sandman/daemon/envd/spec/process/processconnect"
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
	spawn := func() (*proc, error) {
		if meta.tty {
			return s.spawnPTY(cmd, cols, rows)
		}
		return s.spawn(cmd, meta.stdin)
	}
	p, err := s.startTracked(trackSpec{argv: cmd.Args, tag: m.GetTag(), timeout: timeout, envd: meta}, spawn)
	if err != nil {
		return asConnectError(err)
	}
	s.log.Debug("envd process started", "pid", p.pid, "id", p.id, "tag", p.tag, "user", meta.user, "pty", meta.tty, "timeout", timeout)
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
	offset := p.out.total()
	send := func(ev *procpb.ProcessEvent) error { return stream.Send(&procpb.ConnectResponse{Event: ev}) }
	if err := send(startEvent(p)); err != nil {
		return err
	}
	return e.s.envdFollow(ctx, p, offset, keepaliveInterval(req.Header()), send)
}

// List lists the running processes: envd's with their configuration, v1's
// background processes with their command line.
func (e *envdProcess) List(ctx context.Context, req *connect.Request[procpb.ListRequest]) (*connect.Response[procpb.ListResponse], error) {
	var running []*process
	for _, p := range e.s.procs.snapshot() {
		if !p.hasExited() {
			running = append(running, p)
		}
	}
	slices.SortFunc(running, func(a, b *process) int { return a.started.Compare(b.started) })
	out := &procpb.ListResponse{Processes: make([]*procpb.ProcessInfo, 0, len(running))}
	for _, p := range running {
		info := &procpb.ProcessInfo{Pid: uint32(p.pid)}
		if p.envd != nil {
			info.Config = proto.CloneOf(p.envd.config)
		} else if len(p.cmd) > 0 {
			info.Config = &procpb.ProcessConfig{Cmd: p.cmd[0], Args: p.cmd[1:]}
		}
		if p.tag != "" {
			info.Tag = proto.String(p.tag)
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
	var p *process
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
	if p.envd != nil && p.envd.tty {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"process %d runs on a terminal, whose input cannot be closed: send ^D (0x04) as pty input to end a line discipline read, or a signal", p.pid))
	}
	if p.envd != nil && !p.envd.stdin {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"process %d was started without stdin (it reads /dev/null); start it with stdin: true to send input", p.pid))
	}
	p.mu.Lock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	p.mu.Unlock()
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
	if err := e.s.signalGroup(p.pid, syscall.Signal(n)); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %d has exited", p.pid))
		}
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("signal process %d: %w", p.pid, err))
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
	if p.envd == nil || !p.envd.tty {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("process %d has no terminal to resize: start it with pty", p.pid))
	}
	p.mu.Lock()
	tty := p.stdin
	p.mu.Unlock()
	if tty == nil {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %d has exited", p.pid))
	}
	if err := setWinsize(tty, cols, rows); err != nil {
		if errors.Is(err, os.ErrClosed) {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process %d has exited", p.pid))
		}
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("resize the terminal of process %d: %w", p.pid, err))
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
func (s *Server) envdFind(sel *procpb.ProcessSelector, exited bool) (*process, error) {
	var match func(*process) bool
	var what string
	switch v := sel.GetSelector().(type) {
	case *procpb.ProcessSelector_Pid:
		match = func(p *process) bool { return p.pid == int(v.Pid) }
		what = fmt.Sprintf("pid %d", v.Pid)
	case *procpb.ProcessSelector_Tag:
		if v.Tag == "" {
			return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process.tag is empty: name a process by pid or tag"))
		}
		match = func(p *process) bool { return p.tag == v.Tag }
		what = fmt.Sprintf("tag %q", v.Tag)
	default:
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("process is required: select a process by pid or tag"))
	}
	var best *process
	bestRunning := false
	for _, p := range s.procs.snapshot() {
		if !match(p) {
			continue
		}
		running := !p.hasExited()
		switch {
		case best == nil, running && !bestRunning:
		case running == bestRunning && p.started.After(best.started):
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

func (p *process) hasExited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

// envdWrite writes input to a process's stdin (or terminal). A write the
// process does not read blocks until ctx ends.
func envdWrite(ctx context.Context, p *process, input *procpb.ProcessInput) error {
	var data []byte
	tty := p.envd != nil && p.envd.tty
	switch v := input.GetInput().(type) {
	case *procpb.ProcessInput_Stdin:
		data = v.Stdin
	case *procpb.ProcessInput_Pty:
		if !tty {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("process %d has no terminal: send its input as stdin", p.pid))
		}
		data = v.Pty
	default:
		return connect.NewError(connect.CodeInvalidArgument, errors.New("input is required: set stdin or pty"))
	}
	p.inputMu.Lock()
	defer p.inputMu.Unlock()
	p.mu.Lock()
	in, exited := p.stdin, p.exited
	p.mu.Unlock()
	switch {
	case exited:
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("process %d has exited", p.pid))
	case in == nil && p.envd != nil && !p.envd.stdin:
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"process %d was started without stdin (it reads /dev/null); start it with stdin: true to send input", p.pid))
	case in == nil:
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("the stdin of process %d is closed", p.pid))
	case len(data) == 0:
		return nil
	}
	_ = in.SetWriteDeadline(time.Time{})
	stop := context.AfterFunc(ctx, func() { _ = in.SetWriteDeadline(time.Now()) })
	defer stop()
	if _, err := in.Write(data); err != nil {
		switch {
		case ctx.Err() != nil:
			return connect.NewError(connect.CodeOf(ctx.Err()), fmt.Errorf("write to process %d: the process did not read its input before the call ended", p.pid))
		case errors.Is(err, os.ErrClosed), errors.Is(err, syscall.EPIPE), errors.Is(err, syscall.EIO):
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("the stdin of process %d closed while writing (it exited or closed it)", p.pid))
		}
		return connect.NewError(connect.CodeInternal, fmt.Errorf("write to process %d: %w", p.pid, err))
	}
	return nil
}

// envdFollow sends p's output from offset on, as it comes, then its end;
// a keepalive goes out whenever nothing was sent for the keepalive
// interval. It returns when the end is sent, sending fails, or ctx ends
// (the process lives on).
func (s *Server) envdFollow(ctx context.Context, p *process, offset int64, keepalive time.Duration, send func(*procpb.ProcessEvent) error) error {
	tty := p.envd != nil && p.envd.tty
	timer := time.NewTimer(keepalive)
	defer timer.Stop()
	for {
		chunks, dropped, next, closed, changed := p.out.read(offset)
		if dropped > 0 {
			s.log.Warn("envd stream fell behind the retained output", "pid", p.pid, "dropped_bytes", dropped)
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

func startEvent(p *process) *procpb.ProcessEvent {
	return &procpb.ProcessEvent{Event: &procpb.ProcessEvent_Start{Start: &procpb.ProcessEvent_StartEvent{Pid: uint32(p.pid)}}}
}

func dataEvent(c outChunk, tty bool) *procpb.ProcessEvent {
	d := &procpb.ProcessEvent_DataEvent{}
	switch {
	case tty:
		d.Output = &procpb.ProcessEvent_DataEvent_Pty{Pty: c.data}
	case c.stream == api.EventStderr:
		d.Output = &procpb.ProcessEvent_DataEvent_Stderr{Stderr: c.data}
	default:
		d.Output = &procpb.ProcessEvent_DataEvent_Stdout{Stdout: c.data}
	}
	return &procpb.ProcessEvent{Event: &procpb.ProcessEvent_Data{Data: d}}
}

// endEvent is a process's end as envd reports it, after Go's
// os.ProcessState: exit_code is -1 and exited false when a signal ended
// it; status reads "exit status 1" or "signal: killed"; error is set
// unless it exited 0.
func endEvent(p *process) *procpb.ProcessEvent {
	p.mu.Lock()
	st, timedOut := p.status, p.timedOut
	p.mu.Unlock()
	end := &procpb.ProcessEvent_EndEvent{ExitCode: -1}
	switch {
	case st.signal != "":
		end.Status = "signal: " + syscall.Signal(st.code-128).String()
	case st.code < 0:
		end.Status = "unknown: the daemon could not collect the exit status"
	default:
		end.ExitCode, end.Exited = int32(st.code), true
		end.Status = "exit status " + strconv.Itoa(st.code)
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

// spawnPTY starts cmd on a new pseudo-terminal of cols×rows (as the leader
// of a new session, the terminal its controlling one) and records its
// process group. The proc's stdout is the master, and its stdin another
// descriptor of the master, for input and resizes, that can be closed at
// the exit while the output is still being read.
func (s *Server) spawnPTY(cmd *exec.Cmd, cols, rows uint16) (p *proc, retErr error) {
	master, slave, err := openPTY()
	if err != nil {
		return nil, fmt.Errorf("open a pseudo-terminal: %w", err)
	}
	defer slave.Close()
	defer func() {
		if retErr != nil {
			master.Close()
		}
	}()
	if err := setWinsize(master, cols, rows); err != nil {
		return nil, fmt.Errorf("size the pseudo-terminal: %w", err)
	}
	in, err := dupFile(master)
	if err != nil {
		return nil, fmt.Errorf("pseudo-terminal input: %w", err)
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
	cmd.SysProcAttr.Setpgid = false // setsid makes a new group
	cmd.SysProcAttr.Setsid, cmd.SysProcAttr.Setctty, cmd.SysProcAttr.Ctty = true, true, 0
	pid, exit, err := s.reaper.Start(cmd)
	if err != nil {
		in.Close()
		return nil, classifyStart(cmd, err)
	}
	s.addGroup(pid)
	return &proc{pid: pid, exit: exit, stdout: master, stdin: in, start: time.Now()}, nil
}

// openPTY opens a pseudo-terminal pair. It does its own ioctls, through
// SyscallConn, so that the master stays non-blocking (creack/pty's use
// File.Fd, which makes it blocking): reads and writes on it can then be
// interrupted by deadlines and Close.
func openPTY() (master, slave *os.File, retErr error) {
	master, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	defer func() {
		if retErr != nil {
			master.Close()
		}
	}()
	var n uint32
	if err := control(master, func(fd int) error {
		var err error
		if n, err = unix.IoctlGetUint32(fd, unix.TIOCGPTN); err != nil {
			return fmt.Errorf("TIOCGPTN: %w", err)
		}
		if err := unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0); err != nil {
			return fmt.Errorf("unlock: %w", err)
		}
		return nil
	}); err != nil {
		return nil, nil, err
	}
	slave, err = os.OpenFile("/dev/pts/"+strconv.FormatUint(uint64(n), 10), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, err
	}
	return master, slave, nil
}

func setWinsize(f *os.File, cols, rows uint16) error {
	return control(f, func(fd int) error {
		return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Col: cols, Row: rows})
	})
}

// dupFile is a new descriptor of f's open file (close-on-exec), as its own
// *os.File.
func dupFile(f *os.File) (*os.File, error) {
	var nfd int
	if err := control(f, func(fd int) error {
		var err error
		nfd, err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
		return err
	}); err != nil {
		return nil, err
	}
	return os.NewFile(uintptr(nfd), f.Name()), nil
}

// control runs fn on f's descriptor without making it blocking.
func control(f *os.File, fn func(fd int) error) error {
	sc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var fnErr error
	if err := sc.Control(func(fd uintptr) { fnErr = fn(int(fd)) }); err != nil {
		return err
	}
	return fnErr
}

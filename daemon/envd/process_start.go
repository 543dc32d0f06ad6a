package envd

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	procpb "github.com/sandman-dev/sandman/daemon/envd/spec/process"
	"github.com/sandman-dev/sandman/daemon/internal/process"
	"github.com/sandman-dev/sandman/daemon/internal/sandboxuser"
)

// Start runs a process and streams its events: start{pid}, its output as
// it comes, end{exit code, status}, and keepalives on a quiet stream.
func (e *processService) Start(ctx context.Context, req *connect.Request[procpb.StartRequest], stream *connect.ServerStream[procpb.StartResponse]) error {
	s := e.s
	m := req.Msg
	cmd, meta, err := s.buildCommand(callUser(ctx), m.GetProcess())
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
	return s.follow(ctx, p, 0, keepaliveInterval(req.Header()), send)
}

// buildCommand builds the command of a ProcessConfig for user ("" for the
// daemon's own): cmd with args, looked up in PATH unless it has a slash;
// the sandbox's environment, the user's HOME, USER and LOGNAME, and envs
// over them; the working directory cwd resolved for the user
// (sandboxuser.User.Resolve), by default the user's home or, without a
// user, the sandbox's directory.
func (s *Service) buildCommand(user string, cfg *procpb.ProcessConfig) (*exec.Cmd, *procMeta, error) {
	if cfg.GetCmd() == "" {
		return nil, nil, connect.NewError(connect.CodeInvalidArgument, errors.New(
			"process.cmd is required: the program to run, e.g. /bin/bash with args [-l, -c, <command>]"))
	}
	u, err := s.userFor(user)
	if errors.Is(err, sandboxuser.ErrUnknown) {
		return nil, nil, connect.NewError(connect.CodeInvalidArgument, err)
	} else if err != nil {
		return nil, nil, asConnectError(err)
	}
	env := map[string]string{}
	if u.Name != "" {
		env["HOME"], env["USER"], env["LOGNAME"] = u.Home, u.Name, u.Name
	}
	if user != "" {
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
	cmd, err := s.sandbox.Command(append([]string{cfg.GetCmd()}, cfg.GetArgs()...), env, dir)
	if err != nil {
		return nil, nil, err
	}
	if u.Name != "" {
		cred, err := u.Credential()
		if err != nil {
			return nil, nil, asConnectError(err)
		}
		cmd.SysProcAttr.Credential = cred
	}
	config := proto.CloneOf(cfg)
	config.Cwd = proto.String(dir)
	return cmd, &procMeta{config: config, user: user}, nil
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

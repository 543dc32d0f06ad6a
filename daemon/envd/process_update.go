package envd

import (
	"context"
	"errors"
	"fmt"
	"os"

	"connectrpc.com/connect"

	procpb "github.com/sandman-dev/sandman/daemon/envd/spec/process"
	"github.com/sandman-dev/sandman/daemon/internal/process"
)

// Update resizes a process's terminal; the kernel tells its foreground
// process group with SIGWINCH.
func (e *processService) Update(ctx context.Context, req *connect.Request[procpb.UpdateRequest]) (*connect.Response[procpb.UpdateResponse], error) {
	p, err := e.s.find(req.Msg.GetProcess(), false)
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
	if !metaOf(p).isTTY() {
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

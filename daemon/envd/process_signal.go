package envd

import (
	"context"
	"errors"
	"fmt"
	"syscall"

	"connectrpc.com/connect"

	procpb "github.com/sandman-dev/sandman/daemon/envd/spec/process"
)

// SendSignal sends a signal (SIGTERM or SIGKILL in the protocol; any other
// valid number is passed on) to the process's group.
func (e *processService) SendSignal(ctx context.Context, req *connect.Request[procpb.SendSignalRequest]) (*connect.Response[procpb.SendSignalResponse], error) {
	p, err := e.s.find(req.Msg.GetProcess(), false)
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

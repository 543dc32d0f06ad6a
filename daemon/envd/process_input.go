package envd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"connectrpc.com/connect"

	procpb "github.com/sandman-dev/sandman/daemon/envd/spec/process"
	"github.com/sandman-dev/sandman/daemon/internal/process"
)

// SendInput writes one chunk to a process's stdin or terminal.
func (e *processService) SendInput(ctx context.Context, req *connect.Request[procpb.SendInputRequest]) (*connect.Response[procpb.SendInputResponse], error) {
	p, err := e.s.find(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, err
	}
	if err := writeInput(ctx, p, req.Msg.GetInput()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&procpb.SendInputResponse{}), nil
}

// StreamInput writes a client stream of chunks to a process: a start event
// naming it first, then data events (keepalives are ignored). The end of
// the stream leaves stdin open; CloseStdin closes it.
func (e *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[procpb.StreamInputRequest]) (*connect.Response[procpb.StreamInputResponse], error) {
	var p *process.Process
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *procpb.StreamInputRequest_Start:
			if p != nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("a second start event: an input stream goes to one process"))
			}
			var err error
			if p, err = e.s.find(ev.Start.GetProcess(), false); err != nil {
				return nil, err
			}
		case *procpb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("data before the start event: send start{process} first"))
			}
			if err := writeInput(ctx, p, ev.Data.GetInput()); err != nil {
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
func (e *processService) CloseStdin(ctx context.Context, req *connect.Request[procpb.CloseStdinRequest]) (*connect.Response[procpb.CloseStdinResponse], error) {
	p, err := e.s.find(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, err
	}
	if metaOf(p).isTTY() {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"process %d runs on a terminal, whose input cannot be closed: send ^D (0x04) as pty input to end a line discipline read, or a signal", p.PID))
	}
	if metaOf(p).noStdin() {
		return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"process %d was started without stdin (it reads /dev/null); start it with stdin: true to send input", p.PID))
	}
	p.CloseStdin()
	return connect.NewResponse(&procpb.CloseStdinResponse{}), nil
}

// writeInput writes input to a process's stdin (or terminal). A write the
// process does not read blocks until ctx ends.
func writeInput(ctx context.Context, p *process.Process, input *procpb.ProcessInput) error {
	var data []byte
	tty := metaOf(p).isTTY()
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
	case in == nil && metaOf(p).noStdin():
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

package envd

import (
	"context"

	"connectrpc.com/connect"

	procpb "github.com/sandman-dev/sandman/daemon/envd/spec/process"
)

// Connect attaches to a process by pid or tag: start{pid}, its output from
// now on, then end. A process that has exited (and is still remembered)
// gets start and end at once.
func (e *processService) Connect(ctx context.Context, req *connect.Request[procpb.ConnectRequest], stream *connect.ServerStream[procpb.ConnectResponse]) error {
	p, err := e.s.find(req.Msg.GetProcess(), true)
	if err != nil {
		return err
	}
	offset := p.Out.Total()
	send := func(ev *procpb.ProcessEvent) error { return stream.Send(&procpb.ConnectResponse{Event: ev}) }
	if err := send(startEvent(p)); err != nil {
		return err
	}
	return e.s.follow(ctx, p, offset, keepaliveInterval(req.Header()), send)
}

package envd

import (
	"context"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	procpb "github.com/sandman-dev/sandman/daemon/envd/spec/process"
	"github.com/sandman-dev/sandman/daemon/internal/process"
)

// List lists the running processes: envd's with their configuration, v1's
// background processes with their command line.
func (e *processService) List(ctx context.Context, req *connect.Request[procpb.ListRequest]) (*connect.Response[procpb.ListResponse], error) {
	var running []*process.Process
	for _, p := range e.s.procs.Table.Snapshot() {
		if !p.HasExited() {
			running = append(running, p)
		}
	}
	out := &procpb.ListResponse{Processes: make([]*procpb.ProcessInfo, 0, len(running))}
	for _, p := range running {
		info := &procpb.ProcessInfo{Pid: uint32(p.PID)}
		if m := metaOf(p); m != nil {
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

package envd

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"syscall"
	"time"

	"connectrpc.com/connect"

	procpb "github.com/sandman-dev/sandman/daemon/envd/spec/process"
	"github.com/sandman-dev/sandman/daemon/envd/spec/process/processconnect"
	"github.com/sandman-dev/sandman/daemon/internal/process"
)

// processService serves envd's process service. Its processes live in the
// daemon's one process table beside v1's background processes: they hold
// process slots, count as running, are killed at shutdown, and show up in
// GET /v1/processes; envd's List, Connect, input and signals reach v1's
// background processes (and the main process) too.
//
// As in envd, a process outlives the stream that started it: a client that
// goes away leaves it running, and Connect re-attaches by pid or tag. The
// stream's deadline (Connect-Timeout-Ms, the SDKs' timeoutMs) is the
// process's own: it is KILLed when the deadline passes.
type processService struct {
	processconnect.UnimplementedProcessHandler
	s *Service
}

var _ processconnect.ProcessHandler = (*processService)(nil)

// procMeta is what envd keeps about a process it started.
type procMeta struct {
	// config is the request's, with the directory it runs in (for List).
	config *procpb.ProcessConfig
	// tty: the process runs on a pseudo-terminal; its Stdin is a
	// descriptor of its master, for input and resizes.
	tty bool
	// stdin: started with stdin open (always true with a terminal).
	stdin bool
	// user it runs as ("" for the daemon's own).
	user string
}

// metaOf is what envd keeps about p (nil for a process v1 started).
func metaOf(p *process.Process) *procMeta {
	m, _ := p.Meta.(*procMeta)
	return m
}

// isTTY reports whether the process runs on a terminal.
func (m *procMeta) isTTY() bool { return m != nil && m.tty }

// noStdin reports whether envd started the process without stdin.
func (m *procMeta) noStdin() bool { return m != nil && !m.stdin }

// find resolves a selector to a process of the table: a running one
// (the newest, should a tag name several), or, with exited and none
// running, the newest that has exited. Unknown and (without exited) exited
// processes are NotFound, as envd has them.
func (s *Service) find(sel *procpb.ProcessSelector, exited bool) (*process.Process, error) {
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

// follow sends p's output from offset on, as it comes, then its end;
// a keepalive goes out whenever nothing was sent for the keepalive
// interval. It returns when the end is sent, sending fails, or ctx ends
// (the process lives on).
func (s *Service) follow(ctx context.Context, p *process.Process, offset int64, keepalive time.Duration, send func(*procpb.ProcessEvent) error) error {
	tty := metaOf(p).isTTY()
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

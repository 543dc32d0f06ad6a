package main

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// handlerFigures are one runtime handler's figures: bind until the daemon
// answers its first exec, and exec round trips of `true` once it does.
type handlerFigures struct {
	ready, exec durations
}

// handlerBinds binds n sandboxes of image under handler ("" runc, runsc
// gVisor) on a runtime with the pinned runc and runsc, measuring each from
// Bind to the first exec answered, then execs round trips of `true` in
// the last one.
func (b benchEnv) handlerBinds(ctx context.Context, node, image, handler, runc, runsc string, n int) (handlerFigures, error) {
	var f handlerFigures
	rt, stop, err := b.startRuntime(ctx, node, func(c *noderuntime.Config) {
		c.Slots, c.WarmSlots, c.RuncPath, c.RunscPath = 4, 2, runc, runsc
	})
	if err != nil {
		return f, err
	}
	defer stop()
	if err := waitCount(ctx, rt, runtime.StateWarm, 2); err != nil {
		return f, err
	}
	i := 0
	var last *client.Client
	var lastUID string
	f.ready, err = sampleN(n, func() (time.Duration, error) {
		if lastUID != "" {
			if err := rt.Release(ctx, lastUID, 0); err != nil {
				return 0, err
			}
		}
		i++
		uid := node + "-" + strconv.Itoa(i)
		if err := waitCount(ctx, rt, runtime.StateWarm, 1); err != nil {
			return 0, err
		}
		req := runtimetest.Request(uid, image)
		req.RuntimeHandler = handler
		start := time.Now()
		slot, err := rt.Bind(ctx, req)
		if err != nil {
			return 0, err
		}
		lastUID = uid
		c, err := client.New(slot.IP+":49983", client.WithToken(runtimetest.Token))
		if err != nil {
			return 0, err
		}
		last = c
		for time.Since(start) < time.Minute {
			if r, err := c.Exec(ctx, api.ExecRequest{Cmd: []string{"true"}}); err == nil && r.ExitCode == 0 {
				return time.Since(start), nil
			}
			time.Sleep(time.Millisecond)
		}
		return 0, fmt.Errorf("%s: no exec answered a minute after the bind", uid)
	})
	if err != nil {
		return f, err
	}
	f.exec, err = sampleN(max(n, 50), func() (time.Duration, error) {
		start := time.Now()
		r, err := last.Exec(ctx, api.ExecRequest{Cmd: []string{"true"}})
		if err == nil && r.ExitCode != 0 {
			err = fmt.Errorf("true exited %d", r.ExitCode)
		}
		return time.Since(start), err
	})
	if lastUID != "" {
		_ = rt.Release(ctx, lastUID, 0)
	}
	return f, err
}

// gvisorRows compare gVisor with runc (the pinned one), same image, same
// run: bind to first exec, and an exec round trip.
func (b benchEnv) gvisorRows(ctx context.Context, image, runc, runsc string, n int) ([]row, error) {
	rc, err := b.handlerBinds(ctx, "bench-h-runc", image, "", runc, runsc, n)
	if err != nil {
		return nil, fmt.Errorf("runc binds: %w", err)
	}
	gv, err := b.handlerBinds(ctx, "bench-h-runsc", image, runtime.RuntimeHandlerRunsc, runc, runsc, n)
	if err != nil {
		return nil, fmt.Errorf("gVisor binds: %w", err)
	}
	return []row{
		{name: "bind → first exec answered, pinned runc", n: len(rc.ready), p50: ms(rc.ready.p50()), p99: ms(rc.ready.p99()), baseline: "-", ratio: "1.00×"},
		{name: "bind → first exec answered, gVisor (runsc, systrap)", n: len(gv.ready), p50: ms(gv.ready.p50()), p99: ms(gv.ready.p99()), baseline: "pinned runc", ratio: ratio(gv.ready.p50(), rc.ready.p50()), note: "gVisor's start (sandbox, gofer, Sentry)"},
		{name: "exec round trip (true), pinned runc", n: len(rc.exec), p50: ms(rc.exec.p50()), p99: ms(rc.exec.p99()), baseline: "-", ratio: "1.00×"},
		{name: "exec round trip (true), gVisor", n: len(gv.exec), p50: ms(gv.exec.p50()), p99: ms(gv.exec.p99()), baseline: "pinned runc", ratio: ratio(gv.exec.p50(), rc.exec.p50()), note: "fork+exec inside the Sentry"},
	}, nil
}

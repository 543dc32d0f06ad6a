package main

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// pauseSizes are the memory a paused sandbox's process holds, in MiB.
var pauseSizes = []int{64, 256, 1024}

// benchPause: pause and resume of gVisor sandboxes whose process holds
// 64 MiB, 256 MiB and 1 GiB, on the real node runtime, against a cold
// gVisor bind of the same image measured in the same run (bind → first
// exec answered): pause is Pause's return (checkpoint written, task gone),
// resume is Resume's call to the first exec answered. Then live forks of 8
// and 32 of a sandbox holding forkMiB, bound at once.
func benchPause(cfg config) ([]row, error) {
	be, closeEnv, err := openBenchEnv(cfg, benchNamespace)
	if err != nil {
		return nil, err
	}
	defer closeEnv()
	env := be.env
	ctx := namespaces.WithNamespace(context.Background(), benchNamespace)
	image := env["DEBIAN_IMAGE"]
	runc, runsc := env["RUNC_BIN"], env["RUNSC_BIN"]
	if runc == "" {
		runc = filepath.Join(env["SANDMAN_CACHE"], "runc-"+env["RUNC_VERSION"], "runc")
	}
	if runsc == "" {
		runsc = filepath.Join(env["SANDMAN_CACHE"], "gvisor-"+env["GVISOR_VERSION"], "runsc")
	}
	n := max(3, min(cfg.n, 10))
	cold, err := be.handlerBinds(ctx, "bench-p-cold", image, runtime.RuntimeHandlerRunsc, runc, runsc, n)
	if err != nil {
		return nil, fmt.Errorf("cold gVisor binds: %w", err)
	}
	base := cold.ready.p50()
	rows := []row{{name: "cold gVisor bind → first exec answered (Debian)", n: len(cold.ready), p50: ms(base), p99: ms(cold.ready.p99()),
		baseline: "-", ratio: "1.00×"}}
	rt, stop, err := be.startRuntime(ctx, "bench-pause", func(c *noderuntime.Config) {
		c.Slots, c.WarmSlots, c.RuncPath, c.RunscPath = 2+forkCounts[len(forkCounts)-1], 1, runc, runsc
	})
	if err != nil {
		return nil, err
	}
	defer stop()
	for _, mib := range pauseSizes {
		pause, resume, bytes, err := pauseResume(ctx, rt, image, mib, n)
		if err != nil {
			return rows, fmt.Errorf("%d MiB: %w", mib, err)
		}
		rate := float64(bytes) / (1 << 20) / pause.p50().Seconds()
		rows = append(rows,
			row{name: fmt.Sprintf("pause, process holding %d MiB", mib), n: len(pause), p50: ms(pause.p50()), p99: ms(pause.p99()),
				baseline: "-", ratio: "-", note: fmt.Sprintf("checkpoint %d MiB, %.0f MiB/s", bytes>>20, rate)},
			row{name: fmt.Sprintf("resume → first exec answered, %d MiB", mib), n: len(resume), p50: ms(resume.p50()), p99: ms(resume.p99()),
				baseline: "cold gVisor bind", ratio: ratio(resume.p50(), base), note: "restore --background: memory loads after"})
	}
	for _, count := range forkCounts {
		all, each, err := forkMany(ctx, rt, image, forkMiB, count)
		if err != nil {
			return rows, fmt.Errorf("fork of %d: %w", count, err)
		}
		rows = append(rows,
			row{name: fmt.Sprintf("live fork of %d (%d MiB held): bind → first exec, per fork", count, forkMiB), n: len(each), p50: ms(each.p50()), p99: ms(each.p99()),
				baseline: "cold gVisor bind", ratio: ratio(each.p50(), base), note: "one checkpoint, restored concurrently"},
			row{name: fmt.Sprintf("live fork of %d: all answered", count), n: 1, p50: ms(all), p99: ms(all),
				baseline: "-", ratio: "-", note: fmt.Sprintf("%.0f ms per fork", float64(all.Milliseconds())/float64(count))})
	}
	return rows, nil
}

// benchMove: moves of gVisor sandboxes between two nodes (two containerd
// namespaces, so the second fetches the checkpoint from the registry)
// holding 64 and 256 MiB, against a cold gVisor bind of the same image in
// the same run; and how much worker memory pausing frees (density).
func benchMove(cfg config) ([]row, error) {
	be, closeEnv, err := openBenchEnv(cfg, benchNamespace)
	if err != nil {
		return nil, err
	}
	defer closeEnv()
	env := be.env
	ctx := namespaces.WithNamespace(context.Background(), benchNamespace)
	image := env["DEBIAN_IMAGE"]
	runc, runsc := env["RUNC_BIN"], env["RUNSC_BIN"]
	if runc == "" {
		runc = filepath.Join(env["SANDMAN_CACHE"], "runc-"+env["RUNC_VERSION"], "runc")
	}
	if runsc == "" {
		runsc = filepath.Join(env["SANDMAN_CACHE"], "gvisor-"+env["GVISOR_VERSION"], "runsc")
	}
	n := max(3, min(cfg.n, 10))
	cold, err := be.handlerBinds(ctx, "bench-m-cold", image, runtime.RuntimeHandlerRunsc, runc, runsc, n)
	if err != nil {
		return nil, fmt.Errorf("cold gVisor binds: %w", err)
	}
	base := cold.ready.p50()
	rows := []row{{name: "cold gVisor bind → first exec answered (Debian)", n: len(cold.ready), p50: ms(base), p99: ms(cold.ready.p99()),
		baseline: "-", ratio: "1.00×"}}
	repo := env["REGISTRY"] + "/sandman-bench-moved"
	rt, stop, err := be.startRuntime(ctx, "bench-move", func(c *noderuntime.Config) {
		c.Slots, c.WarmSlots, c.RuncPath, c.RunscPath = 2+densityCount, 1, runc, runsc
		c.CheckpointRepository = repo
	})
	if err != nil {
		return nil, err
	}
	defer stop()
	// Moves: a second node, a containerd namespace of its own (its own
	// content: the checkpoint comes from the registry).
	be2 := be
	be2.namespace = benchNamespace + "-b"
	ctx2 := namespaces.WithNamespace(context.Background(), be2.namespace)
	rt2, stop2, err := be2.startRuntime(ctx2, "bench-pause-b", func(c *noderuntime.Config) {
		c.Slots, c.WarmSlots, c.RuncPath, c.RunscPath = 4, 1, runc, runsc
		c.CheckpointRepository = repo
	})
	if err != nil {
		return rows, err
	}
	defer stop2()
	for _, mib := range moveSizes {
		out, in, bytes, err := moveBackAndForth(ctx, ctx2, rt, rt2, image, mib, n)
		if err != nil {
			return rows, fmt.Errorf("move of %d MiB: %w", mib, err)
		}
		rows = append(rows,
			row{name: fmt.Sprintf("move out (pause, push), %d MiB", mib), n: len(out), p50: ms(out.p50()), p99: ms(out.p99()),
				baseline: "-", ratio: "-", note: fmt.Sprintf("artifact %d MiB to the local registry", bytes>>20)},
			row{name: fmt.Sprintf("restore on the other node → first exec answered, %d MiB", mib), n: len(in), p50: ms(in.p50()), p99: ms(in.p99()),
				baseline: "cold gVisor bind", ratio: ratio(in.p50(), base), note: "fetch, unpack, restore --background"})
	}
	freed, each, ckpt, err := pauseDensity(ctx, rt, image, densityCount, densityMiB)
	if err != nil {
		return rows, fmt.Errorf("density: %w", err)
	}
	rows = append(rows, row{name: fmt.Sprintf("worker memory freed by pausing %d sandboxes holding %d MiB", densityCount, densityMiB), n: densityCount,
		p50: fmt.Sprintf("%d MiB", freed>>20), p99: "-", baseline: "-", ratio: "-",
		note: fmt.Sprintf("%d MiB per sandbox running, ~0 paused (checkpoint %d MiB on disk each)", each>>20, ckpt>>20)})
	return rows, nil
}

// forkCounts are the batch sizes of live forks, of a sandbox holding
// forkMiB.
var forkCounts = []int{8, 32}

const forkMiB = 64

// forkMany binds a gVisor sandbox whose process holds mib MiB and forks it
// count times at once (one fork ID): how long until every fork answered an
// exec, and each fork's bind → first exec answered.
func forkMany(ctx context.Context, rt *noderuntime.Runtime, image string, mib, count int) (all time.Duration, each durations, _ error) {
	uid := fmt.Sprintf("bench-fork-src-%d", count)
	hold := fmt.Sprintf("import os, time\nb = bytearray(os.urandom(1 << 20)) * %d\nopen('/tmp/held', 'w').write('1')\ntime.sleep(1e9)\n", mib)
	req := runtimetest.Request(uid, image, "python3", "-c", hold)
	req.RuntimeHandler = runtime.RuntimeHandlerRunsc
	slot, err := rt.Bind(ctx, req)
	if err != nil {
		return 0, nil, err
	}
	uids := []string{uid}
	defer func() {
		for _, u := range uids {
			_ = rt.Release(context.WithoutCancel(ctx), u, 0)
		}
	}()
	if err := answered(ctx, slot, runtimetest.Token, "test", "-f", "/tmp/held"); err != nil {
		return 0, nil, err
	}
	begin := time.Now()
	took := make([]time.Duration, count)
	errs := make(chan error, count)
	for i := range count {
		f := runtimetest.Request(fmt.Sprintf("bench-fork-%d-%d", count, i), image, "python3", "-c", hold)
		f.RuntimeHandler = runtime.RuntimeHandlerRunsc
		f.Fork = &runtime.ForkSource{PodUID: uid, ID: fmt.Sprintf("b%d", count)}
		uids = append(uids, f.Pod.UID)
		go func() {
			start := time.Now()
			sl, err := rt.Bind(ctx, f)
			if err == nil {
				err = answered(ctx, sl, runtimetest.Token, "test", "-f", "/tmp/held")
			}
			took[i] = time.Since(start)
			errs <- err
		}()
	}
	for range count {
		if e := <-errs; e != nil && err == nil {
			err = e
		}
	}
	return time.Since(begin), took, err
}

// answered waits for the daemon of slot to run cmd successfully.
func answered(ctx context.Context, slot runtime.Slot, token string, cmd ...string) error {
	c, err := client.New(slot.IP+":49983", client.WithToken(token), client.WithRetries(0))
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if r, err := c.Exec(ctx, api.ExecRequest{Cmd: cmd}); err == nil && r.ExitCode == 0 {
			return nil
		}
	}
	return fmt.Errorf("%s: %v not answered in 2 minutes", slot.ID, cmd)
}

// pauseResume binds a gVisor sandbox whose main process holds mib MiB
// (written, so every page is in memory), then pauses and resumes it n
// times.
func pauseResume(ctx context.Context, rt *noderuntime.Runtime, image string, mib, n int) (pause, resume durations, bytes int64, _ error) {
	uid := fmt.Sprintf("bench-pause-%d", mib)
	hold := fmt.Sprintf("import os, time\nb = bytearray(os.urandom(1 << 20)) * %d\nopen('/tmp/held', 'w').write('1')\ntime.sleep(1e9)\n", mib)
	req := runtimetest.Request(uid, image, "python3", "-c", hold)
	req.RuntimeHandler = runtime.RuntimeHandlerRunsc
	req.Containers[0].Limits.MemoryBytes = int64(mib+512) << 20
	slot, err := rt.Bind(ctx, req)
	if err != nil {
		return nil, nil, 0, err
	}
	defer func() { _ = rt.Release(context.WithoutCancel(ctx), uid, 0) }()
	c, err := client.New(slot.IP+":49983", client.WithToken(runtimetest.Token), client.WithRetries(0))
	if err != nil {
		return nil, nil, 0, err
	}
	answered := func(cmd ...string) error {
		for deadline := time.Now().Add(2 * time.Minute); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			if r, err := c.Exec(ctx, api.ExecRequest{Cmd: cmd}); err == nil && r.ExitCode == 0 {
				return nil
			}
		}
		return fmt.Errorf("%s: %v not answered in 2 minutes", uid, cmd)
	}
	if err := answered("test", "-f", "/tmp/held"); err != nil {
		return nil, nil, 0, err
	}
	for range n {
		start := time.Now()
		res, err := rt.Pause(ctx, uid)
		if err != nil {
			return nil, nil, 0, err
		}
		pause, bytes = append(pause, time.Since(start)), res.Bytes
		start = time.Now()
		if err := rt.Resume(ctx, uid); err != nil {
			return nil, nil, 0, err
		}
		if err := answered("true"); err != nil {
			return nil, nil, 0, err
		}
		resume = append(resume, time.Since(start))
	}
	return pause, resume, bytes, nil
}

// moveSizes are the memory a moved sandbox's process holds, in MiB.
var moveSizes = []int{64, 256}

// moveBackAndForth binds a gVisor sandbox holding mib MiB on a, then moves
// it n times between the two nodes: Move on the node that holds it (out:
// pause, push), then a bind that restores it on the other until its first
// exec is answered (in).
func moveBackAndForth(ctxA, ctxB context.Context, a, b *noderuntime.Runtime, image string, mib, n int) (out, in durations, bytes int64, _ error) {
	uid := fmt.Sprintf("bench-move-%d", mib)
	hold := fmt.Sprintf("import os, time\nb = bytearray(os.urandom(1 << 20)) * %d\nopen('/tmp/held', 'w').write('1')\ntime.sleep(1e9)\n", mib)
	req := runtimetest.Request(uid, image, "python3", "-c", hold)
	req.RuntimeHandler = runtime.RuntimeHandlerRunsc
	// The image on the second node first: a restore does not pay its pull.
	warm := runtimetest.Request(uid+"-warm", image, "true")
	warm.RuntimeHandler = runtime.RuntimeHandlerRunsc
	if _, err := b.Bind(ctxB, warm); err != nil {
		return nil, nil, 0, err
	}
	_ = b.Release(ctxB, warm.Pod.UID, 0)
	slot, err := a.Bind(ctxA, req)
	if err != nil {
		return nil, nil, 0, err
	}
	nodes := []*noderuntime.Runtime{a, b}
	ctxs := []context.Context{ctxA, ctxB}
	at := 0
	defer func() { _ = nodes[at].Release(context.WithoutCancel(ctxs[at]), uid, 0) }()
	if err := answered(ctxA, slot, runtimetest.Token, "test", "-f", "/tmp/held"); err != nil {
		return nil, nil, 0, err
	}
	for range n {
		start := time.Now()
		moved, err := nodes[at].Move(ctxs[at], uid)
		if err != nil {
			return nil, nil, 0, err
		}
		out, bytes = append(out, time.Since(start)), moved.Bytes
		at = 1 - at
		r := req
		r.Restore = &moved
		start = time.Now()
		slot, err := nodes[at].Bind(ctxs[at], r)
		if err == nil {
			err = answered(ctxs[at], slot, runtimetest.Token, "true")
		}
		if err != nil {
			return nil, nil, 0, err
		}
		in = append(in, time.Since(start))
	}
	return out, in, bytes, nil
}

// Density: how much worker memory pausing frees.
const (
	densityCount = 8
	densityMiB   = 64
)

// pauseDensity binds count gVisor sandboxes holding mib MiB each and pauses
// them all: the worker's MemAvailable before and after (freed), the memory
// one running sandbox's cgroup held (each), and one checkpoint's size.
func pauseDensity(ctx context.Context, rt *noderuntime.Runtime, image string, count, mib int) (freed, each, ckpt int64, _ error) {
	hold := fmt.Sprintf("import os, time\nb = bytearray(os.urandom(1 << 20)) * %d\nopen('/tmp/held', 'w').write('1')\ntime.sleep(1e9)\n", mib)
	var uids []string
	defer func() {
		for _, u := range uids {
			_ = rt.Release(context.WithoutCancel(ctx), u, 0)
		}
	}()
	for i := range count {
		req := runtimetest.Request(fmt.Sprintf("bench-density-%d", i), image, "python3", "-c", hold)
		req.RuntimeHandler = runtime.RuntimeHandlerRunsc
		slot, err := rt.Bind(ctx, req)
		if err != nil {
			return 0, 0, 0, err
		}
		uids = append(uids, req.Pod.UID)
		if err := answered(ctx, slot, runtimetest.Token, "test", "-f", "/tmp/held"); err != nil {
			return 0, 0, 0, err
		}
	}
	var sum uint64
	for _, u := range uids {
		st, err := rt.Stats(ctx, u)
		if err != nil {
			return 0, 0, 0, err
		}
		sum += st.MemoryBytes
	}
	before := memAvailable()
	for _, u := range uids {
		res, err := rt.Pause(ctx, u)
		if err != nil {
			return 0, 0, 0, err
		}
		ckpt = res.Bytes
	}
	return memAvailable() - before, int64(sum) / int64(count), ckpt, nil
}

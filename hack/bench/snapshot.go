package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"golang.org/x/sync/errgroup"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// snapNamespace is the snapshot suite's containerd namespace: a worker of
// its own (the local stack's namespaces share no content), removed at the
// end with everything it pulled or made.
const snapNamespace = "sandman-bench-snap"

// snapRepo is where the suite's snapshots go in the stack's registry; their
// manifests are deleted at the end.
const snapRepo = "sandman-bench-snap"

// setupScript is a setup that works offline: a virtualenv, and a copy of
// the Python standard library byte-compiled (a large tree, as a repository's
// build or a dependency install writes).
const setupScript = `set -e
python3 -m venv /opt/venv
cp -r /usr/lib/python3.11 /opt/pylib
find /opt/pylib -name __pycache__ -prune -exec rm -rf {} +
/opt/venv/bin/python -m compileall -q /opt/pylib >/dev/null`

// benchSnapshot measures prepared environments (snapshots and forks) on the real
// containerd runtime with the stack's registry as the snapshot registry:
// snapshots of a Debian sandbox with 100 MB of changes (and the time it is
// frozen), a fork's bind to its first exec beside a bind of the base image
// on the same warm slots, 20 forks at once, and the setup a fork saves.
func benchSnapshot(cfg config) ([]row, error) {
	be, closeEnv, err := openBenchEnv(cfg, snapNamespace)
	if err != nil {
		return nil, err
	}
	defer closeEnv()
	env, cc := be.env, be.client
	ctx := namespaces.WithNamespace(context.Background(), snapNamespace)
	defer removeNamespace(cc, snapNamespace)
	base := env["DEBIAN_IMAGE"]
	rt, stop, err := be.startRuntime(ctx, "bench-snap", func(c *noderuntime.Config) {
		c.Slots, c.WarmSlots = 24, 21
		c.SnapshotRegistry = env["REGISTRY"] + "/" + snapRepo
	})
	if err != nil {
		return nil, err
	}
	defer stop()
	var digests []string
	defer func() {
		for _, d := range digests {
			req, _ := http.NewRequest(http.MethodDelete, "http://"+env["REGISTRY"]+"/v2/"+snapRepo+"/prep/manifests/"+d, nil)
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}
	}()

	// The original: the setup, then 100 MB of incompressible files.
	orig, err := rt.Bind(ctx, runtimetest.Request("orig", base, "sleep", "infinity"))
	if err != nil {
		return nil, fmt.Errorf("bind the original: %w", err)
	}
	oc, err := answering(ctx, orig, time.Now())
	if err != nil {
		return nil, err
	}
	sh := func(c *client.Client, script string) (time.Duration, error) {
		start := time.Now()
		r, err := c.Exec(ctx, api.ExecRequest{Cmd: []string{"sh", "-c", script}, TimeoutSeconds: 600})
		if err == nil && r.ExitCode != 0 {
			err = fmt.Errorf("%q: exit %d: %s", script, r.ExitCode, r.Stderr)
		}
		return time.Since(start), err
	}
	setup, err := sh(oc, setupScript)
	if err != nil {
		return nil, fmt.Errorf("setup in the original: %w", err)
	}
	if _, err := sh(oc, "head -c 100000000 /dev/urandom > /root/big"); err != nil {
		return nil, err
	}

	// Snapshots: a new stamp each time, so each layer is new to the
	// registry and pushed whole.
	nSnap := max(5, min(cfg.n/100, 10))
	var snaps, frozen durations
	var last runtime.SnapshotResult
	for i := range nSnap {
		if _, err := sh(oc, "date +%s%N > /root/stamp"); err != nil {
			return nil, err
		}
		res, err := rt.Snapshot(ctx, runtime.SnapshotRequest{PodUID: "orig", Image: "prep:v" + strconv.Itoa(i)}, nil)
		if err != nil {
			return nil, fmt.Errorf("snapshot %d: %w", i, err)
		}
		digests = append(digests, res.Digest)
		snaps, frozen = append(snaps, res.Duration), append(frozen, res.Frozen)
		last = res
	}
	fork := last.Image + "@" + last.Digest

	// A fork's bind beside the base image's, alternating, on warm slots.
	nBind := max(10, min(cfg.n/25, 30))
	var baseReady, forkReady durations
	for i := range 2 * nBind {
		image, uid := base, "base-"+strconv.Itoa(i)
		if i%2 == 1 {
			image, uid = fork, "fork-"+strconv.Itoa(i)
		}
		if err := waitCount(ctx, rt, runtime.StateWarm, 1); err != nil {
			return nil, err
		}
		d, err := bindReady(ctx, rt, uid, image)
		if err != nil {
			return nil, err
		}
		if err := rt.Release(ctx, uid, 0); err != nil {
			return nil, err
		}
		if i%2 == 1 {
			forkReady = append(forkReady, d)
		} else {
			baseReady = append(baseReady, d)
		}
	}

	// 20 forks at once, on 20 warm slots.
	if err := waitCount(ctx, rt, runtime.StateWarm, 20); err != nil {
		return nil, err
	}
	var (
		mu    sync.Mutex
		burst durations
		g     errgroup.Group
	)
	start := time.Now()
	for i := range 20 {
		g.Go(func() error {
			d, err := bindReady(ctx, rt, "burst-"+strconv.Itoa(i), fork)
			mu.Lock()
			burst = append(burst, d)
			mu.Unlock()
			return err
		})
	}
	err = g.Wait()
	all := time.Since(start)
	var errs []error
	for i := range 20 {
		errs = append(errs, rt.Release(ctx, "burst-"+strconv.Itoa(i), 0))
	}
	if err := errors.Join(append(errs, err)...); err != nil {
		return nil, fmt.Errorf("20 forks at once: %w", err)
	}
	_ = rt.Release(ctx, "orig", 0)

	mb := func(b int64) string { return fmt.Sprintf("%.1f MB", float64(b)/1e6) }
	return []row{
		{name: "snapshot of a Debian sandbox, 100 MB of changes (freeze, diff, commit, push to the local registry)", n: len(snaps),
			p50: ms(snaps.p50()), p99: ms(snaps.p99()), baseline: "-", ratio: "-",
			note: fmt.Sprintf("frozen p50 %s, p99 %s; %s of changes as a %s layer", ms(frozen.p50()), ms(frozen.p99()), mb(last.DiffBytes), mb(last.LayerBytes))},
		{name: "bind → first exec answered, base image (Debian), warm slot (baseline)", n: len(baseReady),
			p50: ms(baseReady.p50()), p99: ms(baseReady.p99()), baseline: "-", ratio: "1.00×"},
		{name: "bind → first exec answered, fork of the snapshot, same worker, warm slot", n: len(forkReady),
			p50: ms(forkReady.p50()), p99: ms(forkReady.p99()), baseline: "base image bind", ratio: ratio(forkReady.p50(), baseReady.p50()), note: "target ≤ 1.2×"},
		{name: "20 forks bound at once → each answering (runtime Bind, warm slots)", n: len(burst),
			p50: ms(burst.p50()), p99: ms(burst.p99()), baseline: "fork bind alone", ratio: ratio(burst.p50(), forkReady.p50()),
			note: fmt.Sprintf("all 20 answering after %s", ms(all))},
		{name: "setup in the original: venv + compileall of a copy of /usr/lib/python3.11 (offline)", n: 1,
			p50: ms(setup), p99: "-", baseline: "-", ratio: "-"},
		{name: "a fork's bind → first exec answered, instead of the setup", n: len(forkReady),
			p50: ms(forkReady.p50()), p99: ms(forkReady.p99()), baseline: "setup in the original", ratio: ratio(forkReady.p50(), setup),
			note: fmt.Sprintf("the fork is ready %.0f× sooner", float64(setup)/float64(forkReady.p50()))},
	}, nil
}

// bindReady binds uid from image and waits until its daemon answers an
// exec: the time from the bind's call.
func bindReady(ctx context.Context, rt runtime.Runtime, uid, image string) (time.Duration, error) {
	start := time.Now()
	slot, err := rt.Bind(ctx, runtimetest.Request(uid, image, "sleep", "infinity"))
	if err != nil {
		return 0, fmt.Errorf("bind %s: %w", uid, err)
	}
	if _, err := answering(ctx, slot, start); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// answering polls a sandbox's daemon until it answers an exec of `true`.
func answering(ctx context.Context, slot runtime.Slot, start time.Time) (*client.Client, error) {
	c, err := client.New(slot.IP+":49983", client.WithToken(runtimetest.Token))
	if err != nil {
		return nil, err
	}
	for time.Since(start) < time.Minute {
		if r, err := c.Exec(ctx, api.ExecRequest{Cmd: []string{"true"}}); err == nil && r.ExitCode == 0 {
			return c, nil
		}
		time.Sleep(time.Millisecond)
	}
	return nil, fmt.Errorf("%s: no exec answered a minute after the bind", slot.ID)
}

// removeNamespace removes a containerd namespace's images (and so their
// content and snapshots) and the namespace itself.
func removeNamespace(cc *ctrd.Client, ns string) {
	ctx := namespaces.WithNamespace(context.Background(), ns)
	if ls, err := cc.LeasesService().List(ctx); err == nil {
		for _, l := range ls {
			_ = cc.LeasesService().Delete(ctx, l)
		}
	}
	imgs, _ := cc.ImageService().List(ctx)
	for i, img := range imgs {
		var opts []images.DeleteOpt
		if i == len(imgs)-1 {
			opts = append(opts, images.SynchronousDelete())
		}
		_ = cc.ImageService().Delete(ctx, img.Name, opts...)
	}
	if err := cc.NamespaceService().Delete(ctx, ns); err != nil {
		fmt.Fprintf(os.Stderr, "bench: containerd namespace %s left: %v\n", ns, err)
	}
}

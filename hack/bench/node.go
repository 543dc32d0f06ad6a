package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sync/errgroup"

	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

const benchNamespace = "sandman-bench"

// benchNode measures binds on the real containerd runtime beside raw
// containerd create+start of an equivalent container.
func benchNode(cfg config) ([]row, error) {
	be, closeEnv, err := openBenchEnv(cfg, benchNamespace)
	if err != nil {
		return nil, err
	}
	defer closeEnv()
	env, client, daemonBin := be.env, be.client, be.daemonBin
	ctx := namespaces.WithNamespace(context.Background(), benchNamespace)
	image := env["BUSYBOX_IMAGE"]
	resolver := docker.NewResolver(docker.ResolverOptions{Hosts: docker.ConfigureDefaultRegistries(docker.WithPlainHTTP(docker.MatchLocalhost))})
	img, err := client.Pull(ctx, image, ctrd.WithPullUnpack, ctrd.WithResolver(resolver))
	if err != nil {
		return nil, err
	}
	n := min(cfg.n, 60)
	if os.Getenv("BENCH_NODE_MEMORY_ONLY") != "" {
		return be.memoryRows(ctx)
	}

	// Baseline: raw containerd create+start of the same image with the
	// daemon bind-mounted as PID 1 (a fresh, unconfigured netns).
	raw, err := sampleN(n, func() (time.Duration, error) {
		id := "raw-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		start := time.Now()
		c, err := client.NewContainer(ctx, id, ctrd.WithNewSnapshot(id, img),
			ctrd.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs(noderuntime.DaemonMountPath, "--allow-unauthenticated"),
				oci.WithMounts([]specs.Mount{{Destination: noderuntime.DaemonMountPath, Type: "bind", Source: daemonBin, Options: []string{"rbind", "ro"}}})))
		if err != nil {
			return 0, err
		}
		t, err := c.NewTask(ctx, cio.NullIO)
		if err == nil {
			err = t.Start(ctx)
		}
		elapsed := time.Since(start)
		if t != nil {
			_ = t.Kill(ctx, syscall.SIGKILL)
			_, _ = t.Delete(ctx, ctrd.WithProcessKill)
		}
		_ = c.Delete(ctx, ctrd.WithSnapshotCleanup)
		return elapsed, err
	})
	if err != nil {
		return nil, fmt.Errorf("raw containerd: %w", err)
	}

	rt, stop, err := be.startRuntime(ctx, "bench", func(c *noderuntime.Config) { c.Slots, c.WarmSlots = 24, 8 })
	if err != nil {
		return nil, err
	}
	defer stop()
	waitWarm := func(want int) error { return waitCount(ctx, rt, runtime.StateWarm, want) }
	if err := waitWarm(8); err != nil {
		return nil, err
	}
	i := 0
	generic, err := sampleN(n, func() (time.Duration, error) {
		i++
		uid := "g-" + strconv.Itoa(i)
		start := time.Now()
		_, err := rt.Bind(ctx, runtimetest.Request(uid, image))
		elapsed := time.Since(start)
		if err != nil {
			return 0, err
		}
		return elapsed, rt.Release(ctx, uid, 0)
	})
	if err != nil {
		return nil, fmt.Errorf("generic bind: %w", err)
	}

	// The isolation layers, each against the same runtime
	// without it, in the same run: the sandbox firewall (on above: its
	// cost is in generic), and user namespaces with the pinned runc.
	noFW, err := be.genericBinds(ctx, "bench-nofw", image, n, func(c *noderuntime.Config) { c.NoFirewall = true })
	if err != nil {
		return nil, fmt.Errorf("generic bind without the firewall: %w", err)
	}
	runc := env["RUNC_BIN"]
	if runc == "" {
		runc = filepath.Join(env["SANDMAN_CACHE"], "runc-"+env["RUNC_VERSION"], "runc")
	}
	pinned, err := be.genericBinds(ctx, "bench-runc", image, n, func(c *noderuntime.Config) { c.RuncPath = runc })
	if err != nil {
		return nil, fmt.Errorf("generic bind, pinned runc: %w", err)
	}
	// crun (the distribution's, where installed) beside the pinned runc:
	// containerd's runc shim runs either as its binary.
	crunRow := row{name: "generic bind, crun, node's users", n: 0, p50: "-", p99: "-", baseline: "pinned runc, node's users", ratio: "-", note: "crun not installed (apt-get install crun)"}
	if crun, err := exec.LookPath("crun"); err == nil {
		version := "crun"
		if out, err := exec.Command(crun, "--version").Output(); err == nil {
			version = strings.SplitN(string(out), "\n", 2)[0]
		}
		crunRow.name = "generic bind, " + version + " (" + crun + "), node's users"
		d, err := be.genericBinds(ctx, "bench-crun", image, n, func(c *noderuntime.Config) { c.RuncPath = crun })
		if err != nil {
			// A crun too old for the runtime-spec version containerd
			// writes refuses every container: say so, measure the rest.
			crunRow.note = "refused: " + err.Error()
		} else {
			crunRow.n, crunRow.p50, crunRow.p99, crunRow.ratio, crunRow.note = n, ms(d.p50()), ms(d.p99()), ratio(d.p50(), pinned.p50()), ""
		}
	}
	userns, err := be.genericBinds(ctx, "bench-userns", image, n, func(c *noderuntime.Config) {
		c.RuncPath, c.UserNamespaces = runc, noderuntime.UserNamespacesOn
	})
	if err != nil {
		return nil, fmt.Errorf("generic bind in a user namespace: %w", err)
	}
	// gVisor beside the pinned runc: bind to first exec, exec round trip.
	runsc := env["RUNSC_BIN"]
	if runsc == "" {
		runsc = filepath.Join(env["SANDMAN_CACHE"], "gvisor-"+env["GVISOR_VERSION"], "runsc")
	}
	gvisor, err := be.gvisorRows(ctx, image, runc, runsc, n)
	if err != nil {
		return nil, err
	}

	// Hot slots: the busybox image pinned, 4 started sandboxes waiting.
	hotRT, stopHot, err := be.startRuntime(ctx, "bench-hot", func(c *noderuntime.Config) {
		c.Slots, c.WarmSlots, c.HotSlots, c.HotImages = 6, 1, 4, []string{image}
	})
	if err != nil {
		return nil, err
	}
	waitHot := func() error { return waitCount(ctx, hotRT, runtime.StateHot, 4) }
	hot, err := sampleN(min(n, 30), func() (time.Duration, error) {
		if err := waitHot(); err != nil {
			return 0, err
		}
		i++
		uid := "h-" + strconv.Itoa(i)
		start := time.Now()
		_, err := hotRT.Bind(ctx, runtimetest.Request(uid, image))
		elapsed := time.Since(start)
		if err != nil {
			return 0, err
		}
		return elapsed, hotRT.Release(ctx, uid, 0)
	})
	stopHot()
	if err != nil {
		return nil, fmt.Errorf("hot bind: %w", err)
	}

	// Throughput: 48 binds, 8 at a time.
	if err := waitWarm(8); err != nil {
		return nil, err
	}
	const burst = 48
	var g errgroup.Group
	g.SetLimit(8)
	start := time.Now()
	for j := range burst {
		g.Go(func() error {
			for {
				_, err := rt.Bind(ctx, runtimetest.Request("t-"+strconv.Itoa(j), image))
				if !errdefs.IsResourceExhausted(err) {
					return err
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
		if j == 23 {
			// Capacity is 24: release the first half as the second arrives.
			if err := g.Wait(); err != nil {
				return nil, err
			}
			for k := range 24 {
				g.Go(func() error { return rt.Release(ctx, "t-"+strconv.Itoa(k), 0) })
			}
		}
	}
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("throughput: %w", err)
	}
	rate := float64(burst) / time.Since(start).Seconds()

	for k := 24; k < burst; k++ {
		_ = rt.Release(ctx, "t-"+strconv.Itoa(k), 0)
	}
	mem, err := be.memoryRows(ctx)
	if err != nil {
		return nil, err
	}
	rows := []row{
		{name: "raw containerd create+start, same image + daemon (baseline)", n: n, p50: ms(raw.p50()), p99: ms(raw.p99()), baseline: "-", ratio: "1.00×"},
		{name: "generic warm-slot bind (netns+IP ready)", n: n, p50: ms(generic.p50()), p99: ms(generic.p99()), baseline: "raw create+start", ratio: ratio(generic.p50(), raw.p50()), note: "target ≤ 1.2×"},
		{name: "generic bind without the sandbox firewall", n: n, p50: ms(noFW.p50()), p99: ms(noFW.p99()), baseline: "generic bind (firewall on)", ratio: ratio(generic.p50(), noFW.p50()), note: "ratio: the firewall's cost"},
		{name: "generic bind, pinned runc (" + strings.TrimPrefix(filepath.Base(filepath.Dir(runc)), "runc-") + "), node's users", n: n, p50: ms(pinned.p50()), p99: ms(pinned.p99()), baseline: "-", ratio: "1.00×"},
		crunRow,
		{name: "generic bind, pinned runc, user namespace", n: n, p50: ms(userns.p50()), p99: ms(userns.p99()), baseline: "pinned runc, node's users", ratio: ratio(userns.p50(), pinned.p50()), note: "the user namespace's cost (idmapped overlay, own sysfs)"},
		gvisor[0], gvisor[1], gvisor[2], gvisor[3],
		{name: "hot-slot bind (started sandbox assigned)", n: len(hot), p50: ms(hot.p50()), p99: ms(hot.p99()), baseline: "raw create+start", ratio: ratio(hot.p50(), raw.p50()), note: "target p50 ≤ 10 ms"},
		{name: "binds per second, concurrency 8", n: burst, p50: fmt.Sprintf("%.1f /s", rate), p99: "-", baseline: "-", ratio: "-"},
	}
	return append(rows, mem...), nil
}

// sandboxPSS sums the proportional set size of every process whose cgroup
// or command line belongs to containerd namespace ns (tasks and shims).
func sandboxPSS(ns string) (float64, int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return 0, 0, err
	}
	var total float64
	n := 0
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if !strings.Contains(string(cg), "/"+ns+"/") && !strings.Contains(string(cmd), "-namespace\x00"+ns+"\x00") {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "Pss:"); ok {
				kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
				total += float64(kb) * 1024
				n++
			}
		}
	}
	return total, n, nil
}

// memSandboxes is how many idle sandboxes the memory rows measure: whole
// groups of 8 and of 16.
const memSandboxes = 32

// memoryRows measures the host memory per idle sandbox with a shim per
// sandbox and with shim groups (and their holders), each on a runtime of its
// own in a containerd namespace of its own, so nothing else is counted.
func (b benchEnv) memoryRows(ctx context.Context) ([]row, error) {
	var rows []row
	var base float64
	for _, size := range []int{1, 8, 16} {
		name := "a shim per sandbox (--shim-group-size 1)"
		if size > 1 {
			name = fmt.Sprintf("%d sandboxes per shim + holder", size)
		}
		if size == noderuntime.DefaultShimGroupSize {
			name += " (default)"
		}
		pss, procs, err := b.groupedMemory(ctx, size)
		if err != nil {
			return nil, fmt.Errorf("memory, shim groups of %d: %w", size, err)
		}
		r := row{name: "host memory per idle sandbox, " + name, n: memSandboxes, p50: fmt.Sprintf("%.2f MB", pss/memSandboxes/1e6), p99: "-", baseline: "-", ratio: "-",
			note: fmt.Sprintf("PSS of %d processes (daemons, shims, holders); target ≤ 3 MB", procs)}
		if size == 1 {
			base = pss
		} else {
			r.baseline, r.ratio = "shim per sandbox", fmt.Sprintf("%.2f×", pss/base)
		}
		rows = append(rows, r)
	}
	return rows, nil
}

// groupedMemory binds memSandboxes idle sandboxes in shim groups of size and
// measures their host memory.
func (b benchEnv) groupedMemory(ctx context.Context, size int) (float64, int, error) {
	b.namespace = benchNamespace + "-mem"
	image := b.env["BUSYBOX_IMAGE"]
	rt, stop, err := b.startRuntime(ctx, fmt.Sprintf("bench-mem-%d", size), func(c *noderuntime.Config) {
		c.Slots, c.WarmSlots, c.ShimGroupSize = memSandboxes, memSandboxes, size
	})
	if err != nil {
		return 0, 0, err
	}
	defer stop()
	var g errgroup.Group
	g.SetLimit(4)
	for j := range memSandboxes {
		g.Go(func() error {
			for {
				_, err := rt.Bind(ctx, runtimetest.Request("m-"+strconv.Itoa(j), image))
				if !errdefs.IsResourceExhausted(err) {
					return err
				}
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	if err := g.Wait(); err != nil {
		return 0, 0, err
	}
	time.Sleep(2 * time.Second) // let them settle before reading memory
	return sandboxPSS(b.namespace)
}

// benchEnv is what every node benchmark shares.
type benchEnv struct {
	client    *ctrd.Client
	env       map[string]string
	daemonBin string
	// namespace is the containerd namespace (default benchNamespace).
	namespace string
}

// openBenchEnv is the set-up the suites on the stack's containerd share:
// the stack, a containerd client in namespace and the daemon built into a
// temporary directory. closeEnv undoes it.
func openBenchEnv(cfg config, namespace string) (be benchEnv, closeEnv func(), err error) {
	stack, err := framework.Load(cfg.root)
	if err != nil {
		return be, nil, err
	}
	client, err := stack.NewContainerd(namespace)
	if err != nil {
		return be, nil, err
	}
	tmp, err := os.MkdirTemp("", namespace)
	if err != nil {
		client.Close()
		return be, nil, err
	}
	closeEnv = func() {
		os.RemoveAll(tmp)
		client.Close()
	}
	daemonBin, err := buildDaemon(cfg.root, tmp)
	if err != nil {
		closeEnv()
		return be, nil, err
	}
	return benchEnv{client: client, env: stack.Env, daemonBin: daemonBin, namespace: namespace}, closeEnv, nil
}

// startRuntime starts a containerd runtime for a benchmark; stop destroys it.
func (b benchEnv) startRuntime(ctx context.Context, node string, mutate func(*noderuntime.Config)) (*noderuntime.Runtime, func(), error) {
	ns := b.namespace
	if ns == "" {
		ns = benchNamespace
	}
	cfg := noderuntime.Config{
		Client: b.client, Namespace: ns, Node: node,
		StateDir: filepath.Join(b.env["SANDMAN_STATE"], node), DaemonPath: b.daemonBin,
		CNIConfDir: b.env["CNI_CONF_DIR"], CNIBinDir: b.env["CNI_BIN_DIR"],
		Resources: runtime.Resources{MilliCPU: 1 << 30, MemoryBytes: 1 << 50},
		Logger:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: benchLogLevel()})),
	}
	mutate(&cfg)
	rt, err := noderuntime.New(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = rt.Run(rctx) }()
	return rt, func() {
		cancel()
		wg.Wait()
		_ = rt.Destroy(context.Background())
	}, nil
}

// waitCount polls rt until at least want slots are in state.
func waitCount(ctx context.Context, rt runtime.Runtime, state runtime.SlotState, want int) error {
	deadline := time.Now().Add(2 * time.Minute)
	for {
		inv, err := rt.Inventory(ctx)
		if err != nil {
			return err
		}
		if inv.Count()[state] >= want {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d slots not %s: %v", want, state, inv.Count())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// benchLogLevel is Error unless BENCH_DEBUG is set (then Info).
func benchLogLevel() slog.Level {
	if os.Getenv("BENCH_DEBUG") != "" {
		return slog.LevelInfo
	}
	return slog.LevelError
}

// genericBinds measures n generic binds (each released before the next) on
// a runtime of its own, configured by mutate.
func (b benchEnv) genericBinds(ctx context.Context, node, image string, n int, mutate func(*noderuntime.Config)) (durations, error) {
	rt, stop, err := b.startRuntime(ctx, node, func(c *noderuntime.Config) {
		c.Slots, c.WarmSlots = 4, 2
		mutate(c)
	})
	if err != nil {
		return nil, err
	}
	defer stop()
	if err := waitCount(ctx, rt, runtime.StateWarm, 2); err != nil {
		return nil, err
	}
	i := 0
	return sampleN(n, func() (time.Duration, error) {
		i++
		uid := node + "-" + strconv.Itoa(i)
		if err := waitCount(ctx, rt, runtime.StateWarm, 1); err != nil {
			return 0, err
		}
		start := time.Now()
		_, err := rt.Bind(ctx, runtimetest.Request(uid, image))
		elapsed := time.Since(start)
		if err != nil {
			return 0, err
		}
		return elapsed, rt.Release(ctx, uid, 0)
	})
}

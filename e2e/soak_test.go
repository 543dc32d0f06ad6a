//go:build soak && e2e

package e2e

// The soak (`make soak`, hack/test.sh soak; not part of `make test`).
//
// TestSoakChurn runs trainer-like churn on the real stack for SOAK_DURATION
// while a fault scheduler kills and restarts sandman-vk, a node agent,
// containerd, kube-apiserver and etcd, and stops a node agent for longer
// than the pool's bind timeout, one fault at a time. At the end it checks
// that no pod is stuck, no sandbox is bound twice, every failed daemon call
// failed inside a fault window with a clear error, the census equals the
// one taken after warm-up, and each component's RSS is within 10 % of its
// value after warm-up. TestSoakCycles binds and releases SOAK_CYCLES times
// on one node agent and reads its and containerd's RSS and file
// descriptors every 1,000 cycles.
//
// Both write the report (SOAK_REPORT, default docs/reliability.md) with
// its SVG plots beside it, and their raw data to the test artifacts
// directory. The decisions of a run (faults, gaps, each sandbox's plan and
// payloads) come from SOAK_SEED, which the report names.

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"
	krand "k8s.io/apimachinery/pkg/util/rand"

	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/e2e/soakreport"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/nodeapi"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// Fault kinds, as SOAK_FAULTS names them.
const (
	faultVK         = "vk"
	faultAgent      = "agent"
	faultContainerd = "containerd"
	faultAPIServer  = "apiserver"
	faultEtcd       = "etcd"
	faultAgentStop  = "agent-stop"
)

var allFaults = []string{faultVK, faultAgent, faultContainerd, faultAPIServer, faultEtcd, faultAgentStop}

// poolBindTimeout is pool.Config's default BindTimeout, which sandman-vk
// does not expose as a flag: a stopped agent is held longer than this.
const poolBindTimeout = 2 * time.Minute

// soakConfig is the soak's settings, from SOAK_* environment variables.
type soakConfig struct {
	Duration time.Duration // SOAK_DURATION: the churn (default 30m)
	Cycles   int           // SOAK_CYCLES: bind/release cycles (default 10000; 0 skips)
	Seed     uint64        // SOAK_SEED (default: the clock)
	Report   string        // SOAK_REPORT (default docs/reliability.md)
	Agents   int           // SOAK_AGENTS: node agents (default 2)
	Slots    int           // SOAK_SLOTS: slots per agent (default 8)
	// Repeats is how often each kill runs (SOAK_FAULT_REPEATS, 3);
	// StopRepeats how often an agent is stopped (SOAK_STOP_REPEATS, 2:
	// each takes more than the bind timeout).
	Repeats, StopRepeats int
	Faults               []string      // SOAK_FAULTS: kinds, comma-separated (default all)
	Sample               time.Duration // SOAK_SAMPLE_INTERVAL: RSS and bindings (default 5s)
	CreateEvery          time.Duration // SOAK_CREATE_INTERVAL: the steady creator (default 2s)

	// Warmup is churn without faults before the RSS baseline; Window the
	// baseline's length; Tail the churn without faults at the end (a
	// restarted process needs GenWarmup + Window of it).
	Warmup, Window, Tail, GenWarmup time.Duration
}

// defaultSoakSeed is the seed without SOAK_SEED: one per test binary, so
// both parts report the same.
var defaultSoakSeed = uint64(time.Now().UnixNano())

func loadSoakConfig(t *testing.T, s *framework.Stack) soakConfig {
	t.Helper()
	cfg := soakConfig{
		Duration: 30 * time.Minute, Cycles: 10000, Seed: defaultSoakSeed,
		Report: filepath.Join(s.Root, "docs", "reliability.md"), Agents: 2, Slots: 8,
		Repeats: 3, StopRepeats: 2, Faults: allFaults, Sample: 5 * time.Second, CreateEvery: 2 * time.Second,
		GenWarmup: time.Minute,
	}
	env := func(name string, parse func(string) error) {
		if v := os.Getenv(name); v != "" {
			if err := parse(v); err != nil {
				t.Fatalf("%s=%q: %v", name, v, err)
			}
		}
	}
	dur := func(d *time.Duration) func(string) error {
		return func(v string) (err error) { *d, err = time.ParseDuration(v); return err }
	}
	num := func(n *int) func(string) error {
		return func(v string) (err error) { *n, err = strconv.Atoi(v); return err }
	}
	env("SOAK_DURATION", dur(&cfg.Duration))
	env("SOAK_CYCLES", num(&cfg.Cycles))
	env("SOAK_SEED", func(v string) (err error) { cfg.Seed, err = strconv.ParseUint(v, 10, 64); return err })
	env("SOAK_REPORT", func(v string) error {
		cfg.Report = v
		if !filepath.IsAbs(v) {
			cfg.Report = filepath.Join(s.Root, v)
		}
		return nil
	})
	env("SOAK_AGENTS", num(&cfg.Agents))
	env("SOAK_SLOTS", num(&cfg.Slots))
	env("SOAK_FAULT_REPEATS", num(&cfg.Repeats))
	env("SOAK_STOP_REPEATS", num(&cfg.StopRepeats))
	env("SOAK_SAMPLE_INTERVAL", dur(&cfg.Sample))
	env("SOAK_CREATE_INTERVAL", dur(&cfg.CreateEvery))
	env("SOAK_FAULTS", func(v string) error {
		cfg.Faults = nil
		for _, k := range strings.Split(v, ",") {
			if k = strings.TrimSpace(k); k == "" || k == "none" {
				continue
			}
			if !slices.Contains(allFaults, k) {
				return fmt.Errorf("unknown fault %q (known: %s)", k, strings.Join(allFaults, ", "))
			}
			cfg.Faults = append(cfg.Faults, k)
		}
		return nil
	})
	if cfg.Agents < 1 || cfg.Slots < 2 || cfg.Duration < time.Minute || cfg.Sample <= 0 || cfg.CreateEvery <= 0 || cfg.Cycles < 0 {
		t.Fatalf("soak settings out of range: %+v", cfg)
	}
	clamp := func(d, lo, hi time.Duration) time.Duration { return min(max(d, lo), hi) }
	cfg.Warmup = clamp(cfg.Duration/10, time.Minute, 3*time.Minute)
	cfg.Window = clamp(cfg.Duration/30, 20*time.Second, time.Minute)
	cfg.Tail = clamp(cfg.Duration/6, 3*time.Minute, 5*time.Minute)
	return cfg
}

// faultPlanKinds lists each configured kind as often as it should run.
func (c soakConfig) faultPlanKinds() []string {
	var out []string
	for _, k := range c.Faults {
		n := c.Repeats
		if k == faultAgentStop {
			n = c.StopRepeats
		}
		for range n {
			out = append(out, k)
		}
	}
	return out
}

// rng is the soak's random source for one purpose (stream), repeatable
// from the seed.
func (c soakConfig) rng(stream uint64) *rand.Rand {
	return rand.New(rand.NewPCG(c.Seed, stream))
}

// The report both tests write into: each fills its part and writes the
// whole file again.
var soakOut struct {
	sync.Mutex
	report soakreport.Report
	svgs   map[string]string // file name → document, beside the report
}

func publishSoak(t *testing.T, s *framework.Stack, cfg soakConfig, artifacts string, fill func(*soakreport.Report), svgs map[string]string) {
	t.Helper()
	soakOut.Lock()
	defer soakOut.Unlock()
	r := &soakOut.report
	fill(r)
	r.Generated = time.Now()
	r.Seed = cfg.Seed
	r.Artifacts = artifacts
	r.Command = fmt.Sprintf("SOAK_DURATION=%v SOAK_CYCLES=%d SOAK_SEED=%d make soak", cfg.Duration, cfg.Cycles, cfg.Seed)
	r.Params = soakParams(s, cfg)
	if soakOut.svgs == nil {
		soakOut.svgs = map[string]string{}
	}
	for k, v := range svgs {
		soakOut.svgs[k] = v
	}
	dir := filepath.Dir(cfg.Report)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Errorf("report: %v", err)
		return
	}
	for name, doc := range soakOut.svgs {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(doc), 0o644); err != nil {
			t.Errorf("report plot: %v", err)
		}
	}
	if err := os.WriteFile(cfg.Report, []byte(r.Markdown()), 0o644); err != nil {
		t.Errorf("report: %v", err)
		return
	}
	t.Logf("soak report written to %s", cfg.Report)
}

func soakParams(s *framework.Stack, cfg soakConfig) []soakreport.Param {
	commit := "unknown"
	if out, err := exec.Command("git", "-C", s.Root, "rev-parse", "--short", "HEAD").Output(); err == nil {
		commit = strings.TrimSpace(string(out))
		if st, err := exec.Command("git", "-C", s.Root, "status", "--porcelain").Output(); err == nil && len(st) > 0 {
			commit += " (with local changes)"
		}
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	return []soakreport.Param{
		{Name: "SOAK_DURATION", Value: cfg.Duration.String(), Note: "churn; creating stops then, the sandboxes still running finish their plan"},
		{Name: "SOAK_CYCLES", Value: strconv.Itoa(cfg.Cycles)},
		{Name: "SOAK_SEED", Value: strconv.FormatUint(cfg.Seed, 10)},
		{Name: "pool", Value: fmt.Sprintf("%d node agents × %d slots (SOAK_AGENTS, SOAK_SLOTS)", cfg.Agents, cfg.Slots),
			Note: "host processes over the stack's containerd, as the e2e tests run them (startPool: --lost-after 5s, --orphan-grace 3s, --reconcile-interval 1s)"},
		{Name: "faults", Value: fmt.Sprintf("%s; kills ×%d, agent stops ×%d", strings.Join(cfg.Faults, ", "), cfg.Repeats, cfg.StopRepeats),
			Note: fmt.Sprintf("SOAK_FAULTS, SOAK_FAULT_REPEATS, SOAK_STOP_REPEATS; a stop lasts the pool's bind timeout (%v) plus 10–30 s", poolBindTimeout)},
		{Name: "phases", Value: fmt.Sprintf("warm-up %v, baseline %v, faults until %v before the end", cfg.Warmup, cfg.Window, cfg.Tail)},
		{Name: "sampling", Value: cfg.Sample.String(), Note: "RSS, file descriptors and bindings (SOAK_SAMPLE_INTERVAL)"},
		{Name: "steady creation", Value: "one sandbox every " + cfg.CreateEvery.String() + " while fewer than the pool's slots are live", Note: "SOAK_CREATE_INTERVAL; bursts of ½–1½ × the slots every 1–4 min"},
		{Name: "host", Value: fmt.Sprintf("%d CPUs, Linux %s, %s", goruntime.NumCPU(), strings.TrimSpace(string(kernel)), goruntime.Version())},
		{Name: "commit", Value: commit},
	}
}

// writeJSON saves v in the artifacts directory.
func writeJSON(t *testing.T, dir, name string, v any) {
	t.Helper()
	b, err := json.MarshalIndent(v, "", " ")
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, name), b, 0o644)
	}
	if err != nil {
		t.Errorf("artifact %s: %v", name, err)
	}
}

// soakArtifacts is a fresh directory for this test's raw data and logs.
func soakArtifacts(t *testing.T, part string) string {
	t.Helper()
	dir := filepath.Join(artifactDir(t), "soak-"+part+"-"+time.Now().Format("20060102-150405"))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestSoakChurn: the churn under faults (see the top of this file).
func TestSoakChurn(t *testing.T) {
	s := framework.Get(t)
	cfg := loadSoakConfig(t, s)
	// Set-up, SOAK_DURATION, then at most the drain and four settling
	// waits of 3 minutes each.
	need := cfg.Duration + 5*time.Minute + drainTimeout + 4*3*time.Minute
	if dl, ok := t.Deadline(); ok && time.Until(dl) < need {
		t.Fatalf("go test -timeout leaves %v; the churn may need %v (SOAK_DURATION %v plus set-up, drain and settling): raise -timeout (hack/test.sh soak derives it)",
			time.Until(dl).Round(time.Second), need, cfg.Duration)
	}
	t.Logf("soak: SOAK_SEED=%d SOAK_DURATION=%v faults %v", cfg.Seed, cfg.Duration, cfg.Faults)
	r := newChurnRun(t, s, cfg)
	// Registered before the pool so that it runs after the pool's own
	// cleanups: the agents the soak restarted are stopped last, as the
	// pool's first agents are.
	t.Cleanup(r.stopRestartedAgents)
	// No hot slots: the census at the end wants every slot warm as at
	// the start, and a hot pool stays while its image is in the mix.
	r.p = startPool(t, s, cfg.Agents, cfg.Slots, "--hot-slots", "0")
	r.setup()
	defer r.abort()
	r.run()
}

// TestSoakCycles: SOAK_CYCLES bind/release cycles on one node agent.
func TestSoakCycles(t *testing.T) {
	s := framework.Get(t)
	cfg := loadSoakConfig(t, s)
	if cfg.Cycles == 0 {
		t.Skip("SOAK_CYCLES=0")
	}
	t.Logf("soak cycles: %d", cfg.Cycles)
	artifacts := soakArtifacts(t, "cycles")
	const workers, slots = 4, 4
	name := "cyc-" + krand.String(5)
	ca := censusAgent{name: name, namespace: "sandman-e2e-" + name, stateDir: filepath.Join(framework.StateDir(), "e2e-nodes", name)}
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	args := []string{"--node", name, "--containerd-address", s.ContainerdAddress, "--namespace", ca.namespace,
		"--slots", strconv.Itoa(slots), "--warm-slots", strconv.Itoa(slots), "--hot-slots", "0", "--cpu", "4", "--memory", "8Gi",
		"--state-dir", ca.stateDir, "--daemon-path", buildDaemon(t, s.Root), "--runc", s.RuncBin,
		"--cni-conf-dir", s.CNIConfDir, "--cni-bin-dir", s.CNIBinDir, "--listen", addr}
	a := startAgent(t, buildNode(t, s.Root), args)
	ca.client = nodeapi.NewClient(addr, "pool-secret", nil)
	ctx := t.Context()
	allWarm := func(what string) {
		framework.Eventually(t, 2*time.Minute, what, func(ctx context.Context) (bool, error) {
			inv, err := ca.client.Inventory(ctx)
			return err == nil && len(inv.Slots) == slots && inv.Count()[runtime.StateWarm] == slots, nil
		})
	}
	allWarm("every slot warm")
	// Warm the image and every slot so the baseline is steady.
	for i := range slots {
		if _, err := ca.client.Bind(ctx, runtimetest.Request(fmt.Sprintf("warmup-%d", i), s.BusyboxImage)); err != nil {
			t.Fatalf("warm-up bind: %v", err)
		}
	}
	for i := range slots {
		if err := ca.client.Release(ctx, fmt.Sprintf("warmup-%d", i), 0); err != nil {
			t.Fatalf("warm-up release: %v", err)
		}
	}
	allWarm("every slot warm after the warm-up")
	before, err := takeSoakCensus(ctx, s, []censusAgent{ca}, "")
	if err != nil {
		t.Fatal(err)
	}

	ctrd := s.Component(t, "containerd")
	agentPID := a.cmd.Process.Pid
	res := &soakreport.Cycles{Agent: name, Workers: workers, Planned: cfg.Cycles, Start: time.Now()}
	var mu sync.Mutex // guards res.Checkpoints, failures
	var failures []string
	checkpoint := func(n int) {
		au, _ := procUsage(agentPID)
		cu, _ := procUsage(ctrd.Pid())
		cp := soakreport.Checkpoint{Cycles: n, Elapsed: time.Since(res.Start), AgentRSS: au.rss, AgentFDs: au.fds, ContainerdRSS: cu.rss, ContainerdFDs: cu.fds}
		mu.Lock()
		res.Checkpoints = append(res.Checkpoints, cp)
		mu.Unlock()
		t.Logf("cycles %d (%v): agent %.1f MiB %d fds, containerd %.1f MiB %d fds", n, cp.Elapsed.Round(time.Second),
			float64(au.rss)/(1<<20), au.fds, float64(cu.rss)/(1<<20), cu.fds)
	}
	checkpoint(0)
	// Stop early rather than be killed by go test's timeout without a report.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if dl, ok := t.Deadline(); ok {
		var c2 context.CancelFunc
		cctx, c2 = context.WithDeadline(cctx, dl.Add(-5*time.Minute))
		defer c2()
	}
	var next, done, failed atomic.Int64
	g, gctx := errgroup.WithContext(cctx)
	for range workers {
		g.Go(func() error {
			for gctx.Err() == nil {
				i := next.Add(1) - 1
				if i >= int64(cfg.Cycles) {
					return nil
				}
				uid := fmt.Sprintf("soak-cycle-%d", i)
				bctx, bcancel := context.WithTimeout(gctx, poolBindTimeout)
				_, err := ca.client.Bind(bctx, runtimetest.Request(uid, s.BusyboxImage))
				bcancel()
				if err == nil {
					err = ca.client.Release(gctx, uid, 0)
				} else {
					_ = ca.client.Release(context.WithoutCancel(gctx), uid, 0)
				}
				if err != nil && gctx.Err() == nil {
					mu.Lock()
					failures = append(failures, fmt.Sprintf("cycle %d: %v", i, err))
					mu.Unlock()
					if failed.Add(1) >= 100 {
						return fmt.Errorf("100 cycles failed, the last: %w", err)
					}
				}
				if n := done.Add(1); n%1000 == 0 {
					checkpoint(int(n))
				}
			}
			return nil
		})
	}
	gerr := g.Wait()
	res.Done = int(done.Load())
	res.Duration = time.Since(res.Start)
	if res.Done%1000 != 0 {
		checkpoint(res.Done)
	}
	// Workers crossing two thousands at once may have appended out of order.
	slices.SortFunc(res.Checkpoints, func(a, b soakreport.Checkpoint) int { return a.Cycles - b.Cycles })
	if gerr != nil {
		failures = append(failures, gerr.Error())
	}
	if res.Done < cfg.Cycles {
		failures = append(failures, fmt.Sprintf("only %d of %d cycles ran (%v)", res.Done, cfg.Cycles, cctx.Err()))
	}
	allWarmErr := waitAllWarm(context.WithoutCancel(ctx), []censusAgent{ca}, map[string]int{name: slots}, 2*time.Minute)
	if allWarmErr != nil {
		failures = append(failures, allWarmErr.Error())
	}
	after, leaks := settleCensus(context.WithoutCancel(ctx), s, []censusAgent{ca}, "", before, 2*time.Minute)
	res.CensusBefore, res.CensusAfter = before, after
	for _, d := range leaks {
		failures = append(failures, fmt.Sprintf("census: %s %d before, %d after%s", d.Name, d.Before, d.After, errNote(d.Err)))
	}
	if n := len(failures); n > 20 {
		failures = append(failures[:20], fmt.Sprintf("… and %d more", n-20))
	}
	res.Failures = failures
	res.Plot = "reliability-cycles.svg"
	writeJSON(t, artifacts, "cycles.json", res)
	plot := soakreport.CyclesPlot(fmt.Sprintf("RSS over %d bind/release cycles on one node agent", res.Done), res.Checkpoints)
	publishSoak(t, s, cfg, artifacts, func(r *soakreport.Report) { r.Cycles = res }, map[string]string{res.Plot: plot.SVG()})
	for _, f := range failures {
		t.Error(f)
	}
}

func errNote(err string) string {
	if err == "" {
		return ""
	}
	return " (" + err + ")"
}

//go:build root

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"golang.org/x/sync/errgroup"

	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// resourceCounts counts what a sandbox can leave behind on a node.
type resourceCounts map[string]int

func countResources(t *testing.T, s *framework.Stack) resourceCounts {
	t.Helper()
	cc := s.Containerd(t, runtimeNamespace)
	ctx := namespaces.WithNamespace(context.Background(), runtimeNamespace)
	out := resourceCounts{}
	cs, err := cc.Containers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out["containers"] = len(cs)
	tasks, err := cc.TaskService().List(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	out["tasks"] = len(tasks.Tasks)
	n := 0
	if err := cc.SnapshotService("overlayfs").Walk(ctx, func(context.Context, snapshots.Info) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	out["snapshots"] = n
	leases, err := cc.LeasesService().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	out["leases"] = len(leases)
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	out["mounts"] = strings.Count(string(mi), "\n")
	nsList, _ := filepath.Glob("/run/netns/*")
	out["netns (/run/netns)"] = len(nsList)
	ipam, _ := filepath.Glob(filepath.Join(framework.StateDir(), "cni/ipam/sandman/*"))
	out["IP allocations"] = len(ipam)
	tr, _ := filepath.Glob(filepath.Join(framework.StateDir(), "test-runtimes/*/netns/*"))
	out["netns (runtime)"] = len(tr)
	for _, ctl := range []string{"memory", "pids", "cpu"} {
		d, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup", ctl, runtimeNamespace))
		dirs := 0
		for _, e := range d {
			if e.IsDir() {
				dirs++
			}
		}
		out["cgroups/"+ctl] = dirs
	}
	return out
}

// TestRootBindReleaseLeaves nothing: 1,000 bind/release cycles
// (SANDMAN_LEAK_CYCLES; make test runs 300, make soak 10,000) leave the same
// containers, tasks, snapshots, leases, mounts, network namespaces, IP
// allocations and cgroups as before.
func TestRootBindReleaseLeavesNothing(t *testing.T) {
	s := framework.Get(t)
	cycles := 1000
	if v := os.Getenv("SANDMAN_LEAK_CYCLES"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("SANDMAN_LEAK_CYCLES=%q: want a number of cycles ≥ 1", v)
		}
		cycles = n
	}
	const workers = 4
	rt := newContainerdRuntime(t, s, workers, workers, func(c *noderuntime.Config) {
		// Slots per shim group (default the runtime's), to compare.
		if v := os.Getenv("SANDMAN_LEAK_SHIM_GROUP"); v != "" {
			c.ShimGroupSize, _ = strconv.Atoi(v)
		}
	})
	ctx := t.Context()
	waitAllWarm := func() {
		framework.Eventually(t, time.Minute, "every slot warm", func(ctx context.Context) (bool, error) {
			inv, err := rt.Inventory(ctx)
			return err == nil && inv.Count()[runtime.StateWarm] == workers, err
		})
	}
	waitAllWarm()
	// Warm the image and the first slot so the baseline is steady.
	if _, err := rt.Bind(ctx, runtimetest.Request("leak-warmup", s.BusyboxImage)); err != nil {
		t.Fatal(err)
	}
	if err := rt.Release(ctx, "leak-warmup", 0); err != nil {
		t.Fatal(err)
	}
	waitAllWarm()
	before := countResources(t, s)

	start := time.Now()
	var g errgroup.Group
	var mu sync.Mutex
	done := 0
	for w := range workers {
		g.Go(func() error {
			for i := w; i < cycles; i += workers {
				uid := fmt.Sprintf("leak-%d", i)
				if _, err := rt.Bind(ctx, runtimetest.Request(uid, s.BusyboxImage)); err != nil {
					return fmt.Errorf("cycle %d bind: %w", i, err)
				}
				if err := rt.Release(ctx, uid, 0); err != nil {
					return fmt.Errorf("cycle %d release: %w", i, err)
				}
				mu.Lock()
				done++
				mu.Unlock()
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d bind/release cycles with %d workers in %v", done, workers, time.Since(start).Round(time.Millisecond))
	waitAllWarm()
	after := countResources(t, s)
	for k, v := range before {
		if after[k] != v {
			t.Errorf("%s: %d before, %d after %d cycles", k, v, after[k], cycles)
		}
	}
	t.Logf("resources (before = after): %v", before)
}

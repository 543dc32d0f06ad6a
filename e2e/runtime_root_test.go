//go:build root

package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

const runtimeNamespace = "sandman-rt"

// newContainerdRuntime starts a containerd runtime against the stack and
// destroys it (and checks nothing is left) when the test ends.
func newContainerdRuntime(t *testing.T, s *framework.Stack, slots, warm int, mutate ...func(*noderuntime.Config)) *noderuntime.Runtime {
	t.Helper()
	node := "rt-" + rand.String(6)
	stateDir := filepath.Join(framework.StateDir(), "test-runtimes", node)
	cc := s.Containerd(t, runtimeNamespace)
	logLevel := slog.LevelWarn
	if os.Getenv("SANDMAN_TEST_DEBUG") != "" {
		logLevel = slog.LevelDebug
	}
	cfg := noderuntime.Config{
		Client: cc, Namespace: runtimeNamespace, Node: node, Slots: slots, WarmSlots: warm,
		StateDir: stateDir, DaemonPath: buildDaemon(t, s.Root),
		CNIConfDir: s.CNIConfDir, CNIBinDir: s.CNIBinDir, PidsLimit: 256,
		Resources: runtime.Resources{MilliCPU: 64000, MemoryBytes: 64 << 30},
		Logger:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel})),
	}
	for _, m := range mutate {
		m(&cfg)
	}
	rt, err := noderuntime.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = rt.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		if err := rt.Destroy(dctx); err != nil {
			t.Errorf("destroy runtime: %v", err)
		}
		left, err := cc.Containers(dctx, fmt.Sprintf(`labels."%s"==%s`, noderuntime.LabelNode, node))
		if err != nil || len(left) > 0 {
			t.Errorf("containers left after destroy: %d (%v)", len(left), err)
		}
		if entries, _ := os.ReadDir(filepath.Join(stateDir, "netns")); len(entries) > 0 {
			t.Errorf("%d network namespaces left after destroy", len(entries))
		}
		_ = os.RemoveAll(stateDir)
	})
	return rt
}

func sandboxExec(ctx context.Context, slot runtime.Slot, token string, argv ...string) (string, error) {
	c, err := client.New(fmt.Sprintf("%s:%d", slot.IP, api.Port), client.WithToken(token), client.WithRetries(0))
	if err != nil {
		return "", err
	}
	res, err := c.Exec(ctx, api.ExecRequest{Cmd: argv})
	if err != nil {
		return "", err
	}
	return string(res.Stdout), nil
}

// TestRootContainerdConformance runs the runtime contract's suite against
// the containerd runtime on the stack's containerd, runc and CNI.
func TestRootContainerdConformance(t *testing.T) {
	s := framework.Get(t)
	runtimetest.Suite(t, func(t *testing.T) runtimetest.Harness {
		return runtimetest.Harness{
			Runtime: newContainerdRuntime(t, s, 3, 2), Slots: 3, WarmSlots: 2,
			Image: s.BusyboxImage, NoShellImage: s.NoShellImage, MissingImage: s.Registry + "/sandman/nope:missing",
			Exec:    sandboxExec,
			Timeout: 60 * time.Second,
		}
	})
}

// TestRootHotSlots: pinned images get started sandboxes whose daemon waits;
// binding one assigns it the pod's token, env, hostname, limits and command;
// a pod that asks for root and nothing else takes one too, another user not.
func TestRootHotSlots(t *testing.T) {
	s := framework.Get(t)
	rt := newContainerdRuntime(t, s, 4, 1, func(c *noderuntime.Config) {
		c.HotSlots, c.HotImages = 2, []string{s.BusyboxImage}
	})
	ctx := t.Context()
	framework.Eventually(t, time.Minute, "two hot slots", func(ctx context.Context) (bool, error) {
		inv, err := rt.Inventory(ctx)
		return err == nil && inv.Count()[runtime.StateHot] == 2, err
	})
	req := runtimetest.Request("hot-1", s.BusyboxImage, "sh", "-c", "echo main-ran > /tmp/main; sleep 1000")
	req.Containers[0].Env = []string{"POD_ENV=from-pod"}
	req.Containers[0].Limits.MemoryBytes = 256 << 20
	start := time.Now()
	slot, err := rt.Bind(ctx, req)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("hot bind took %v", took)
	if slot.State != runtime.StateBound || slot.Image != s.BusyboxImage {
		t.Fatalf("slot %+v", slot)
	}
	out, err := sandboxExec(ctx, slot, runtimetest.Token, "sh", "-c", "echo $POD_ENV $(hostname)")
	if err != nil || out != "from-pod pod-hot-1\n" {
		t.Fatalf("exec in the assigned sandbox: %q %v", out, err)
	}
	if st, err := rt.Stats(ctx, "hot-1"); err != nil || st.MemoryLimitBytes != 256<<20 {
		t.Fatalf("memory limit of the assigned sandbox: %d (%v), want %d", st.MemoryLimitBytes, err, 256<<20)
	}
	// Each try has its own deadline, so that one stalled call cannot use up
	// the wait; the last answer is logged when the wait fails.
	var last string
	defer func() {
		if t.Failed() {
			t.Logf("the last try at /tmp/main answered: %s", last)
		}
	}()
	framework.Eventually(t, 30*time.Second, "the main process to run", func(ctx context.Context) (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		out, err := sandboxExec(ctx, slot, runtimetest.Token, "cat", "/tmp/main")
		last = fmt.Sprintf("%q, err %v", out, err)
		return err == nil && out == "main-ran\n", nil
	})
	if _, err := sandboxExec(ctx, slot, "wrong", "true"); err == nil {
		t.Fatal("a wrong token was accepted")
	}
	if err := rt.Release(ctx, "hot-1", time.Second); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, time.Minute, "the hot pool to refill", func(ctx context.Context) (bool, error) {
		inv, err := rt.Inventory(ctx)
		return err == nil && inv.Count()[runtime.StateHot] == 2, err
	})

	// A pod that asks for root and nothing else takes a hot sandbox that
	// runs as root (busybox's user is root); one that asks for another
	// user does not.
	root := runtimetest.Request("hot-root", s.BusyboxImage)
	root.Containers[0].User = "0:0"
	rootSlot, err := rt.Bind(ctx, root)
	if err != nil {
		t.Fatal(err)
	}
	// A hot sandbox's container is the one started before the bind
	// (its ID ends in -hot); a generic bind makes <slot>-<name>.
	cc := s.Containerd(t, runtimeNamespace)
	cs, err := cc.Containers(namespaces.WithNamespace(ctx, runtimeNamespace), fmt.Sprintf(`labels."%s"==%s`, noderuntime.LabelSlot, rootSlot.ID))
	if err != nil || len(cs) != 1 || !strings.HasSuffix(cs[0].ID(), "-hot") {
		var ids []string
		for _, c := range cs {
			ids = append(ids, c.ID())
		}
		t.Errorf("the pod that asks for root runs in containers %v (%v), want its slot's hot sandbox", ids, err)
	}
	if out, err := sandboxExec(ctx, rootSlot, runtimetest.Token, "id", "-u"); err != nil || out != "0\n" {
		t.Errorf("id -u in the root pod's sandbox: %q %v", out, err)
	}
	user := runtimetest.Request("warm-user", s.BusyboxImage)
	user.Containers[0].User = "1000:1000"
	userSlot, err := rt.Bind(ctx, user)
	if err != nil {
		t.Fatal(err)
	}
	// A generic bind's daemon answers once its container has started.
	framework.Eventually(t, time.Minute, "id -u = 1000 in the uid 1000 pod's sandbox", func(ctx context.Context) (bool, error) {
		out, err := sandboxExec(ctx, userSlot, runtimetest.Token, "id", "-u")
		return err == nil && out == "1000\n", nil
	})
	for _, uid := range []string{"hot-root", "warm-user"} {
		if err := rt.Release(ctx, uid, time.Second); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRootExclusiveCPUs: a pod that asks for exclusive cores gets them, and
// every other sandbox leaves them until the pod is released.
func TestRootExclusiveCPUs(t *testing.T) {
	s := framework.Get(t)
	if goruntime.NumCPU() < 2 {
		t.Skip("needs 2 CPUs: CPU 0 is reserved for the shared pool")
	}
	rt := newContainerdRuntime(t, s, 3, 1)
	ctx := t.Context()
	all := fmt.Sprintf("0-%d", goruntime.NumCPU()-1)
	cpus := func(sl runtime.Slot) string {
		t.Helper()
		var out string
		framework.Eventually(t, time.Minute, "the sandbox's CPU list", func(ctx context.Context) (bool, error) {
			var err error
			out, err = sandboxExec(ctx, sl, runtimetest.Token, "sh", "-c", "grep Cpus_allowed_list /proc/self/status | cut -f2")
			return err == nil, nil
		})
		return strings.TrimSpace(out)
	}
	shared, err := rt.Bind(ctx, runtimetest.Request("shared", s.BusyboxImage))
	if err != nil {
		t.Fatal(err)
	}
	if got := cpus(shared); got != all {
		t.Fatalf("shared sandbox runs on %q, want %q", got, all)
	}
	req := runtimetest.Request("exclusive", s.BusyboxImage)
	req.Containers[0].ExclusiveCPUs = 1
	excl, err := rt.Bind(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if got := cpus(excl); got != "1" {
		t.Fatalf("exclusive sandbox runs on %q, want 1", got)
	}
	wantShared := "0"
	if goruntime.NumCPU() > 2 {
		wantShared = fmt.Sprintf("0,2-%d", goruntime.NumCPU()-1)
	}
	if got := cpus(shared); got != wantShared {
		t.Fatalf("shared sandbox runs on %q while core 1 is exclusive, want %q", got, wantShared)
	}
	more := runtimetest.Request("too-many", s.BusyboxImage)
	more.Containers[0].ExclusiveCPUs = goruntime.NumCPU()
	if _, err := rt.Bind(ctx, more); !errdefs.IsResourceExhausted(err) {
		t.Fatalf("more exclusive cores than free: %v", err)
	}
	if err := rt.Release(ctx, "exclusive", 0); err != nil {
		t.Fatal(err)
	}
	if got := cpus(shared); got != all {
		t.Fatalf("shared sandbox runs on %q after the release, want %q", got, all)
	}
	if err := rt.Release(ctx, "shared", 0); err != nil {
		t.Fatal(err)
	}
}

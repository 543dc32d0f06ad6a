//go:build root

package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// holderRuntime is a containerd runtime of shim groups of 3 on 6 slots,
// all warm, whose lifecycle the test drives (stop: Close or Destroy).
type holderRuntime struct {
	*noderuntime.Runtime
	cancel context.CancelFunc
	done   chan struct{}
}

func holderConfig(t *testing.T, s *framework.Stack) noderuntime.Config {
	node := "hold-" + rand.String(6)
	stateDir := filepath.Join(framework.StateDir(), "test-runtimes", node)
	t.Cleanup(func() { _ = os.RemoveAll(stateDir) })
	logLevel := slog.LevelWarn
	if os.Getenv("SANDMAN_TEST_DEBUG") != "" {
		logLevel = slog.LevelDebug
	}
	return noderuntime.Config{
		Client: s.Containerd(t, runtimeNamespace), Namespace: runtimeNamespace, Node: node, Slots: 6, WarmSlots: 6,
		ShimGroupSize: 3, StateDir: stateDir, DaemonPath: buildDaemon(t, s.Root),
		CNIConfDir: s.CNIConfDir, CNIBinDir: s.CNIBinDir, PidsLimit: 256,
		Resources: runtime.Resources{MilliCPU: 64000, MemoryBytes: 64 << 30},
		Logger:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel})),
	}
}

func startHolderRuntime(t *testing.T, cfg noderuntime.Config) *holderRuntime {
	t.Helper()
	rt, err := noderuntime.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	h := &holderRuntime{Runtime: rt, cancel: cancel, done: make(chan struct{})}
	go func() { defer close(h.done); _ = rt.Run(ctx) }()
	return h
}

// stop ends Run, then closes (bound sandboxes and their groups' holders
// stay) or destroys the runtime.
func (h *holderRuntime) stop(t *testing.T, destroy bool) {
	t.Helper()
	h.cancel()
	<-h.done
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var err error
	if destroy {
		err = h.Destroy(ctx)
	} else {
		err = h.Close(ctx)
	}
	if err != nil {
		t.Fatalf("stop runtime (destroy %v): %v", destroy, err)
	}
}

// holderInfo is a holder container and the shim its task runs under.
type holderInfo struct {
	id, group string
	shim      int
}

// holders lists node's holders by group (failing on two in one group).
func holders(t *testing.T, cc *ctrd.Client, node string) map[string]holderInfo {
	t.Helper()
	ctx := namespaces.WithNamespace(t.Context(), runtimeNamespace)
	cs, err := cc.Containers(ctx, fmt.Sprintf(`labels."%s"==%s,labels."%s"==true`, noderuntime.LabelNode, node, noderuntime.LabelHolder))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]holderInfo{}
	for _, c := range cs {
		l, err := c.Labels(ctx)
		if err != nil {
			t.Fatal(err)
		}
		g := l[noderuntime.LabelShimGroup]
		if prev, ok := out[g]; ok {
			t.Fatalf("two holders in shim group %s: %s and %s", g, prev.id, c.ID())
		}
		out[g] = holderInfo{id: c.ID(), group: g, shim: shimOf(t, cc, c.ID())}
	}
	return out
}

// holderCount counts node's holder containers (some may be on their way
// out: no task asked).
func holderCount(t *testing.T, cc *ctrd.Client, node string) int {
	t.Helper()
	ctx := namespaces.WithNamespace(t.Context(), runtimeNamespace)
	cs, err := cc.Containers(ctx, fmt.Sprintf(`labels."%s"==%s,labels."%s"==true`, noderuntime.LabelNode, node, noderuntime.LabelHolder))
	if err != nil {
		t.Fatal(err)
	}
	return len(cs)
}

// runningHolder is the holder of node's group whose task runs, if one does.
func runningHolder(t *testing.T, cc *ctrd.Client, node, group string) (string, bool) {
	t.Helper()
	ctx := namespaces.WithNamespace(t.Context(), runtimeNamespace)
	cs, err := cc.Containers(ctx, fmt.Sprintf(`labels."%s"==%s,labels."%s"==%s`, noderuntime.LabelNode, node, noderuntime.LabelShimGroup, group))
	if err != nil {
		return "", false
	}
	for _, c := range cs {
		task, err := c.Task(ctx, nil)
		if err != nil {
			continue
		}
		if st, err := task.Status(ctx); err == nil && st.Status == ctrd.Running {
			return c.ID(), true
		}
	}
	return "", false
}

// holderPID is the PID of container id's task (a holder's or a sandbox's).
func holderPID(t *testing.T, cc *ctrd.Client, id string) int {
	t.Helper()
	ctx := namespaces.WithNamespace(t.Context(), runtimeNamespace)
	c, err := cc.LoadContainer(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		t.Fatalf("task of %s: %v", id, err)
	}
	return int(task.Pid())
}

// shimOf is the PID of the shim container id's task runs under (its
// init's parent).
func shimOf(t *testing.T, cc *ctrd.Client, id string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", holderPID(t, cc, id)))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "PPid:"); ok {
			ppid, _ := strconv.Atoi(strings.TrimSpace(v))
			return ppid
		}
	}
	t.Fatalf("no PPid for %s", id)
	return 0
}

// isShim: pid is a containerd shim process.
func isShim(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && strings.Contains(string(b), "containerd-shim")
}

// bindAll binds uids (retrying while the node has no free slot).
func bindAll(t *testing.T, rt runtime.Runtime, image string, uids []string) map[string]runtime.Slot {
	t.Helper()
	ctx := t.Context()
	slots := make([]runtime.Slot, len(uids))
	var g errgroup.Group
	for i, uid := range uids {
		g.Go(func() error {
			var err error
			slots[i], err = rt.Bind(ctx, runtimetest.Request(uid, image))
			return err
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("bind: %v", err)
	}
	out := map[string]runtime.Slot{}
	for i, uid := range uids {
		out[uid] = slots[i]
	}
	return out
}

// sandboxShims is the shim of each bound sandbox's first container, by
// pod UID.
func sandboxShims(t *testing.T, cc *ctrd.Client, bound map[string]runtime.Slot) map[string]int {
	t.Helper()
	out := map[string]int{}
	for uid, sl := range bound {
		out[uid] = shimOf(t, cc, sl.ID+"-task")
	}
	return out
}

func waitSlots(t *testing.T, rt runtime.Runtime, state runtime.SlotState, n int) {
	t.Helper()
	framework.Eventually(t, 2*time.Minute, fmt.Sprintf("%d slots %s", n, state), func(ctx context.Context) (bool, error) {
		inv, err := rt.Inventory(ctx)
		return err == nil && inv.Count()[state] == n && len(inv.Slots) == 6, err
	})
}

// TestRootShimGroupHolder: with shim groups, each group has one holder
// from the moment it has a slot, and the group's shim stays the same
// process across binds and releases of all its slots; the inventory never
// shows a holder; a killed holder is replaced; a drain, then Destroy,
// remove the holders and their shims exit.
func TestRootShimGroupHolder(t *testing.T) {
	s := framework.Get(t)
	cfg := holderConfig(t, s)
	cc := cfg.Client
	rt := startHolderRuntime(t, cfg)
	destroyed := false
	t.Cleanup(func() {
		if !destroyed {
			rt.stop(t, true)
		}
	})
	waitSlots(t, rt, runtime.StateWarm, 6)
	first := holders(t, cc, cfg.Node)
	if len(first) != 2 {
		t.Fatalf("%d holders for 6 slots in groups of 3, want 2: %v", len(first), first)
	}
	shims := map[int]string{}
	for g, h := range first {
		if !isShim(h.shim) {
			t.Fatalf("holder %s runs under %d, not a shim", h.id, h.shim)
		}
		shims[h.shim] = g
	}
	for round := range 3 {
		var uids []string
		for i := range 6 {
			uids = append(uids, fmt.Sprintf("hold-%d-%d", round, i))
		}
		bound := bindAll(t, rt, s.BusyboxImage, uids)
		perShim := map[int]int{}
		for uid, pid := range sandboxShims(t, cc, bound) {
			if _, ok := shims[pid]; !ok {
				t.Fatalf("round %d: pod %s runs under shim %d, not one of the holders' %v", round, uid, pid, shims)
			}
			perShim[pid]++
		}
		for pid, n := range perShim {
			if n != 3 {
				t.Fatalf("round %d: %d sandboxes on shim %d, want 3 (%v)", round, n, pid, perShim)
			}
		}
		inv, err := rt.Inventory(t.Context())
		if err != nil || len(inv.Slots) != 6 || inv.Count()[runtime.StateBound] != 6 {
			t.Fatalf("round %d: inventory %v (%v), want 6 bound slots and nothing else", round, inv.Count(), err)
		}
		for uid := range bound {
			if err := rt.Release(t.Context(), uid, 0); err != nil {
				t.Fatal(err)
			}
		}
		waitSlots(t, rt, runtime.StateWarm, 6)
		now := holders(t, cc, cfg.Node)
		for g, h := range first {
			if now[g] != h {
				t.Fatalf("round %d: group %s's holder was %+v, is %+v", round, g, h, now[g])
			}
		}
		if len(now) != len(first) {
			t.Fatalf("round %d: holders %v, want %v", round, now, first)
		}
	}
	// A holder killed from outside is replaced in its group.
	var victim holderInfo
	for _, h := range first {
		victim = h
	}
	if err := syscall.Kill(holderPID(t, cc, victim.id), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 30*time.Second, "a new holder in the killed one's group", func(context.Context) (bool, error) {
		id, ok := runningHolder(t, cc, cfg.Node, victim.group)
		return ok && id != victim.id && holderCount(t, cc, cfg.Node) == 2, nil
	})
	// A drain sheds the idle slots: their groups and holders go; an
	// undrain brings both back.
	if err := rt.Drain(t.Context(), "holder test"); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, time.Minute, "the drained node's slots and holders to go", func(ctx context.Context) (bool, error) {
		inv, err := rt.Inventory(ctx)
		return err == nil && len(inv.Slots) == 0 && holderCount(t, cc, cfg.Node) == 0, err
	})
	rt.Undrain()
	waitSlots(t, rt, runtime.StateWarm, 6)
	again := holders(t, cc, cfg.Node)
	if len(again) != 2 {
		t.Fatalf("%d holders after an undrain, want 2: %v", len(again), again)
	}
	framework.Eventually(t, 30*time.Second, "the drained groups' shims to exit", func(context.Context) (bool, error) {
		for pid := range shims {
			if isShim(pid) {
				return false, nil
			}
		}
		return true, nil
	})
	shims = map[int]string{}
	for g, h := range again {
		shims[h.shim] = g
	}
	rt.stop(t, true)
	destroyed = true
	if left := holders(t, cc, cfg.Node); len(left) != 0 {
		t.Fatalf("holders left after Destroy: %v", left)
	}
	framework.Eventually(t, 30*time.Second, "the groups' shims to exit", func(context.Context) (bool, error) {
		for pid := range shims {
			if isShim(pid) {
				return false, nil
			}
		}
		return true, nil
	})
}

// TestRootShimGroupHolderRecovery: Close keeps the holders of groups with
// bound sandboxes and removes the others; a restarted agent re-adopts
// those holders (same container, same shim), removes orphaned or
// duplicate ones and gives every group exactly one holder.
func TestRootShimGroupHolderRecovery(t *testing.T) {
	s := framework.Get(t)
	cfg := holderConfig(t, s)
	cc := cfg.Client
	ctx := namespaces.WithNamespace(t.Context(), runtimeNamespace)
	rt := startHolderRuntime(t, cfg)
	waitSlots(t, rt, runtime.StateWarm, 6)
	bound := bindAll(t, rt, s.BusyboxImage, []string{"rec-a", "rec-b"})
	before := sandboxShims(t, cc, bound)
	held := holders(t, cc, cfg.Node)
	rt.stop(t, false)

	// Left: the holders of the groups of rec-a and rec-b, nothing else.
	kept := holders(t, cc, cfg.Node)
	want := map[int]bool{}
	for _, pid := range before {
		want[pid] = true
	}
	if len(kept) != len(want) {
		t.Fatalf("after Close: holders %v; want one per group with a bound sandbox (shims %v)", kept, before)
	}
	for g, h := range kept {
		if !want[h.shim] || held[g] != h {
			t.Fatalf("after Close: holder %+v is not that of a bound sandbox's group (shims %v, holders before %v)", h, before, held)
		}
	}
	// What a crashed agent could leave: a holder of a group that no longer
	// exists and a second holder of a kept group (neither started).
	var someGroup string
	for g := range kept {
		someGroup = g
	}
	for id, group := range map[string]string{"holder-orphan" + rand.String(4): cfg.Node + "-shim-gone", "holder-dup" + rand.String(4): someGroup} {
		if _, err := cc.NewContainer(ctx, id, ctrd.WithNewSpec(), ctrd.WithContainerLabels(map[string]string{
			noderuntime.LabelNode: cfg.Node, noderuntime.LabelHolder: "true", noderuntime.LabelShimGroup: group,
		})); err != nil {
			t.Fatal(err)
		}
	}

	rt = startHolderRuntime(t, cfg)
	t.Cleanup(func() { rt.stop(t, true) })
	waitSlots(t, rt, runtime.StateWarm, 4)
	after := holders(t, cc, cfg.Node)
	for g, h := range kept {
		if after[g] != h {
			t.Fatalf("group %s's holder %+v was not re-adopted: %+v", g, h, after[g])
		}
	}
	if got := sandboxShims(t, cc, bound); fmt.Sprint(got) != fmt.Sprint(before) {
		t.Fatalf("re-adopted sandboxes' shims %v, were %v", got, before)
	}
	// Fill the node: every group's slots show their shim; each shim has
	// exactly one holder, and no holder is without slots.
	more := bindAll(t, rt, s.BusyboxImage, []string{"rec-c", "rec-d", "rec-e", "rec-f"})
	for uid, sl := range bound {
		more[uid] = sl
	}
	perShim := map[int]int{}
	for _, pid := range sandboxShims(t, cc, more) {
		perShim[pid]++
	}
	after = holders(t, cc, cfg.Node)
	if len(after) != len(perShim) {
		t.Fatalf("%d holders for %d groups in use (%v; sandboxes per shim %v)", len(after), len(perShim), after, perShim)
	}
	for _, h := range after {
		if n := perShim[h.shim]; n == 0 || n > 3 {
			t.Fatalf("holder %+v: %d sandboxes on its shim (%v)", h, n, perShim)
		}
	}
}

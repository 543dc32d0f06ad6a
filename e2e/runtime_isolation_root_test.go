//go:build root

package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// TestRootSandboxIsolation: a sandbox that exhausts its memory or its
// process limit is limited alone; its neighbour and the node keep working.
// A pod whose command needs a shell in an image without one ends with a
// clear exit event.
func TestRootSandboxIsolation(t *testing.T) {
	s := framework.Get(t)
	rt := newContainerdRuntime(t, s, 4, 2, func(c *noderuntime.Config) {
		c.DiskCheckInterval, c.DiskInodes = 200*time.Millisecond, 2000
	})
	ctx := t.Context()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, events, err := rt.Watch(wctx)
	if err != nil {
		t.Fatal(err)
	}
	greedy := runtimetest.Request("greedy", s.BusyboxImage)
	greedy.Containers[0].Limits.MemoryBytes = 64 << 20
	a, err := rt.Bind(ctx, greedy)
	if err != nil {
		t.Fatal(err)
	}
	b, err := rt.Bind(ctx, runtimetest.Request("neighbour", s.BusyboxImage))
	if err != nil {
		t.Fatal(err)
	}
	ca := daemonClient(t, a)
	framework.Eventually(t, time.Minute, "both sandboxes ready", func(ctx context.Context) (bool, error) {
		_, e1 := sandboxExec(ctx, a, runtimetest.Token, "true")
		_, e2 := sandboxExec(ctx, b, runtimetest.Token, "true")
		return e1 == nil && e2 == nil, nil
	})

	// What the daemon starts is the OOM killer's first choice, the daemon
	// (PID 1, whose death would end the sandbox) its last.
	// The daemon raises a child's score right after starting it, so a
	// command that reads its own score at once may still see the daemon's
	// (daemon/reaper_linux.go says so): polled, not read once.
	var out string
	framework.Eventually(t, 10*time.Second, "an exec's oom_score_adj to be the daemon's + 1000", func(ctx context.Context) (bool, error) {
		var err error
		out, err = sandboxExec(ctx, a, runtimetest.Token, "cat", "/proc/1/oom_score_adj", "/proc/self/oom_score_adj")
		var daemonAdj, execAdj int
		_, serr := fmt.Sscan(out, &daemonAdj, &execAdj)
		return err == nil && serr == nil && execAdj == min(1000, daemonAdj+1000) && execAdj > daemonAdj, nil
	})
	// Memory: the hog is OOM-killed inside its own cgroup.
	res, err := ca.Exec(ctx, api.ExecRequest{Shell: "head -c 400000000 /dev/zero | tail > /dev/null", TimeoutSeconds: 60})
	if err != nil || res.ExitCode == 0 {
		t.Fatalf("memory hog in a 64 MiB sandbox: err %v, exit %v", err, res)
	}
	t.Logf("memory hog ended with exit %d (%s)", res.ExitCode, res.Signal)
	// Processes: a fork bomb hits the pids limit.
	// The call itself may fail (its connection cut while the sandbox is
	// out of processes); what must hold is that both sandboxes answer
	// afterwards (below): a daemon that died would end its sandbox.
	if _, err := ca.Exec(ctx, api.ExecRequest{Shell: "bomb() { bomb | bomb & }; bomb; sleep 2", TimeoutSeconds: 3, MaxOutputBytes: 1024}); err != nil && !client.IsCode(err, api.CodeTooManyRequests) {
		t.Logf("fork bomb exec: %v", err)
	}
	for _, sl := range []runtime.Slot{a, b} {
		framework.Eventually(t, time.Minute, "sandbox "+sl.Pod.UID+" to answer after its own or its neighbour's abuse", func(ctx context.Context) (bool, error) {
			out, err := sandboxExec(ctx, sl, runtimetest.Token, "echo", "ok")
			return err == nil && out == "ok\n", nil
		})
	}

	// Disk: a sandbox that writes past its limit is stopped alone.
	filler := runtimetest.Request("filler", s.BusyboxImage)
	filler.Containers[0].DiskBytes = 50 << 20
	f, err := rt.Bind(ctx, filler)
	if err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, time.Minute, "the filler to answer", func(ctx context.Context) (bool, error) {
		_, err := sandboxExec(ctx, f, runtimetest.Token, "true")
		return err == nil, nil
	})
	// The exec may end before or because the sandbox is stopped.
	_, _ = daemonClient(t, f).Exec(ctx, api.ExecRequest{Shell: "dd if=/dev/zero of=/fill bs=1M count=200; sleep 30"})
	waitExit(t, events, f.ID, func(ev runtime.Event) {
		if ev.Reason != runtime.ReasonEvicted || ev.Message == "" {
			t.Fatalf("filler exit %+v: want reason Evicted with a message", ev)
		}
	})
	for _, sl := range []runtime.Slot{a, b} {
		if out, err := sandboxExec(ctx, sl, runtimetest.Token, "echo", "ok"); err != nil || out != "ok\n" {
			t.Fatalf("sandbox %s after its neighbour filled its disk: %q %v", sl.Pod.UID, out, err)
		}
	}

	// Inodes: a sandbox that makes more files than the node allows is
	// stopped alone, however few bytes they hold.
	if err := rt.Release(ctx, "filler", time.Second); err != nil {
		t.Fatal(err)
	}
	many, err := rt.Bind(ctx, runtimetest.Request("many-files", s.BusyboxImage))
	if err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, time.Minute, "the file maker to answer", func(ctx context.Context) (bool, error) {
		_, err := sandboxExec(ctx, many, runtimetest.Token, "true")
		return err == nil, nil
	})
	_, _ = daemonClient(t, many).Exec(ctx, api.ExecRequest{Shell: "mkdir /many && cd /many && i=0; while [ $i -lt 5000 ]; do : > f$i; i=$((i+1)); done; sleep 30"})
	waitExit(t, events, many.ID, func(ev runtime.Event) {
		if ev.Reason != runtime.ReasonEvicted || !strings.Contains(ev.Message, "files and directories") {
			t.Fatalf("file maker exit %+v: want reason Evicted for its files", ev)
		}
	})

	// A shell command in an image without a shell: the main process cannot
	// start, the sandbox exits 127 and says so.
	c, err := rt.Bind(ctx, runtimetest.Request("no-shell-cmd", s.NoShellImage, "sh", "-c", "true"))
	if err != nil {
		t.Fatal(err)
	}
	waitExit(t, events, c.ID, func(ev runtime.Event) {
		if ev.ExitCode != 127 || ev.Reason != runtime.ReasonError {
			t.Fatalf("exit event %+v: want 127 Error", ev)
		}
	})
	for _, uid := range []string{"greedy", "neighbour", "many-files", "no-shell-cmd"} {
		if err := rt.Release(ctx, uid, time.Second); err != nil {
			t.Fatal(err)
		}
	}
}

// waitExit waits for the exit event of slot and checks it.
func waitExit(t *testing.T, events <-chan runtime.Event, slot string, check func(runtime.Event)) {
	t.Helper()
	check(runtimetest.WaitEvent(t, events, time.Minute, "the exit event of slot "+slot, func(ev runtime.Event) bool {
		return ev.Type == runtime.EventExit && ev.Slot.ID == slot
	}))
}
func daemonClient(t *testing.T, sl runtime.Slot) *client.Client {
	t.Helper()
	c, err := client.New(sl.IP+":49983", client.WithToken(runtimetest.Token))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

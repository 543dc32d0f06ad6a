//go:build root

package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// TestRootSandboxIsolation: a sandbox that exhausts its memory or its
// process limit is limited alone; its neighbour and the node keep working.
// A pod whose command needs a shell in an image without one ends with a
// clear exit event.
func TestRootSandboxIsolation(t *testing.T) {
	s := framework.Get(t)
	rt := newContainerdRuntime(t, s, 3, 2)
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

	// Memory: the hog is OOM-killed inside its own cgroup.
	res, err := ca.Exec(ctx, api.ExecRequest{Shell: "head -c 400000000 /dev/zero | tail > /dev/null", TimeoutSeconds: 60})
	if err != nil || res.ExitCode == 0 {
		t.Fatalf("memory hog in a 64 MiB sandbox: err %v, exit %v", err, res)
	}
	t.Logf("memory hog ended with exit %d (%s)", res.ExitCode, res.Signal)
	// Processes: a fork bomb hits the pids limit.
	if _, err := ca.Exec(ctx, api.ExecRequest{Shell: "bomb() { bomb | bomb & }; bomb; sleep 2", TimeoutSeconds: 3, MaxOutputBytes: 1024}); err != nil && !client.IsCode(err, api.CodeTooManyRequests) {
		t.Fatalf("fork bomb: %v", err)
	}
	for _, sl := range []runtime.Slot{a, b} {
		framework.Eventually(t, time.Minute, "sandbox "+sl.Pod.UID+" to answer after its own or its neighbour's abuse", func(ctx context.Context) (bool, error) {
			out, err := sandboxExec(ctx, sl, runtimetest.Token, "echo", "ok")
			return err == nil && out == "ok\n", nil
		})
	}

	// A shell command in an image without a shell: the main process cannot
	// start, the sandbox exits 127 and says so.
	c, err := rt.Bind(ctx, runtimetest.Request("no-shell-cmd", s.NoShellImage, "sh", "-c", "true"))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.After(time.Minute)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("watch closed")
			}
			if ev.Type == runtime.EventExit && ev.Slot.ID == c.ID {
				if ev.ExitCode != 127 || ev.Reason != runtime.ReasonError {
					t.Fatalf("exit event %+v: want 127 Error", ev)
				}
				for _, uid := range []string{"greedy", "neighbour", "no-shell-cmd"} {
					if err := rt.Release(ctx, uid, time.Second); err != nil {
						t.Fatal(err)
					}
				}
				return
			}
		case <-deadline:
			t.Fatal("no exit event for a main command the image cannot run")
		}
	}
}

func daemonClient(t *testing.T, sl runtime.Slot) *client.Client {
	t.Helper()
	c, err := client.New(sl.IP+":49983", client.WithToken(runtimetest.Token))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

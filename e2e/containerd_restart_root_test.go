//go:build root

package e2e

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// TestRootSurvivesContainerdRestart: containerd is killed and started again
// under a bound sandbox; the sandbox keeps answering, no false exit is
// reported, and binds and releases work again.
func TestRootSurvivesContainerdRestart(t *testing.T) {
	s := framework.Get(t)
	rt := newContainerdRuntime(t, s, 3, 1)
	ctx := t.Context()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, events, err := rt.Watch(wctx)
	if err != nil {
		t.Fatal(err)
	}
	a, err := rt.Bind(ctx, runtimetest.Request("survivor", s.BusyboxImage))
	if err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, time.Minute, "the sandbox to answer", func(ctx context.Context) (bool, error) {
		out, err := sandboxExec(ctx, a, runtimetest.Token, "echo", "up")
		return err == nil && out == "up\n", nil
	})

	pidFile := filepath.Join(framework.StateDir(), "pids", "containerd.pid")
	b, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill containerd: %v", err)
	}
	framework.Eventually(t, 30*time.Second, "containerd to be gone", func(context.Context) (bool, error) {
		return syscall.Kill(pid, 0) != nil, nil
	})
	up := exec.Command("bash", filepath.Join(s.Root, "hack", "local-up.sh"))
	if out, err := up.CombinedOutput(); err != nil {
		t.Fatalf("restart containerd: %v\n%s", err, out)
	}

	if out, err := sandboxExec(ctx, a, runtimetest.Token, "echo", "still up"); err != nil || out != "still up\n" {
		t.Fatalf("sandbox after the containerd restart: %q %v", out, err)
	}
	var bSlot runtime.Slot
	framework.Eventually(t, time.Minute, "a bind to work again", func(ctx context.Context) (bool, error) {
		bSlot, err = rt.Bind(ctx, runtimetest.Request("after-restart", s.BusyboxImage))
		return err == nil, nil
	})
	if out, err := sandboxExec(ctx, bSlot, runtimetest.Token, "echo", "new"); err != nil || out != "new\n" {
		// Readiness may lag the bind by a moment.
		framework.Eventually(t, 30*time.Second, "the new sandbox to answer", func(ctx context.Context) (bool, error) {
			out, err := sandboxExec(ctx, bSlot, runtimetest.Token, "echo", "new")
			return err == nil && out == "new\n", nil
		})
	}
	for _, uid := range []string{"survivor", "after-restart"} {
		if err := rt.Release(ctx, uid, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	for {
		select {
		case ev := <-events:
			if ev.Type == runtime.EventExit && ev.Slot.Pod != nil && ev.Slot.Pod.UID == "survivor" {
				t.Fatalf("false exit event across the containerd restart: %+v", ev)
			}
		default:
			return
		}
	}
}

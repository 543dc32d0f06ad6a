//go:build root

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/nodeapi"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// TestRootNodeAgentRecovers: kill -9 of sandman-node with 50 bound
// sandboxes; after a restart all 50 are reported bound and answer, none
// duplicated, none lost.
func TestRootNodeAgentRecovers(t *testing.T) {
	s := framework.Get(t)
	const pods = 50
	node := "rec-" + rand.String(6)
	stateDir := filepath.Join(framework.StateDir(), "test-runtimes", node)
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	args := []string{"--node", node, "--containerd-address", s.ContainerdAddress, "--namespace", runtimeNamespace,
		"--slots", strconv.Itoa(pods + 4), "--warm-slots", "8", "--state-dir", stateDir,
		"--daemon-path", buildDaemon(t, s.Root), "--runc", s.RuncBin, "--cni-conf-dir", s.CNIConfDir, "--cni-bin-dir", s.CNIBinDir,
		"--listen", addr, "--cpu", "1000", "--memory", "1000Gi", "--log-level", "warn"}
	bin := buildNode(t, s.Root)
	// Registered first, so it runs after the agents have stopped.
	t.Cleanup(func() {
		if entries, _ := os.ReadDir(filepath.Join(stateDir, "netns")); len(entries) > 0 {
			t.Errorf("%d network namespaces left after the agent stopped", len(entries))
		}
		_ = os.RemoveAll(stateDir)
	})
	a := startAgent(t, bin, args)
	c := nodeapi.NewClient(addr, "pool-secret", nil)
	ctx := t.Context()
	waitInventory := func(what string, cond func(runtime.Inventory) bool) runtime.Inventory {
		var inv runtime.Inventory
		framework.Eventually(t, 2*time.Minute, what, func(ctx context.Context) (bool, error) {
			var err error
			inv, err = c.Inventory(ctx)
			return err == nil && cond(inv), nil
		})
		return inv
	}
	waitInventory("the agent to answer with warm slots", func(inv runtime.Inventory) bool { return inv.Count()[runtime.StateWarm] > 0 })

	var g errgroup.Group
	g.SetLimit(6)
	for i := range pods {
		g.Go(func() error {
			uid := fmt.Sprintf("rec-%02d", i)
			for {
				_, err := c.Bind(ctx, runtimetest.Request(uid, s.BusyboxImage))
				if !errdefs.IsResourceExhausted(err) {
					return err
				}
				time.Sleep(50 * time.Millisecond)
			}
		})
	}
	if err := g.Wait(); err != nil {
		t.Fatalf("bind: %v", err)
	}
	before := waitInventory("all pods ready", func(inv runtime.Inventory) bool { return countReady(inv) == pods })

	// kill -9, then start again.
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.done
	startAgent(t, bin, args)
	after := waitInventory("the restarted agent to report every pod ready", func(inv runtime.Inventory) bool { return countReady(inv) == pods })

	bySlot := map[string]string{}
	for _, sl := range before.Slots {
		if sl.Pod != nil {
			bySlot[sl.Pod.UID] = sl.ID + "/" + sl.IP
		}
	}
	seen := map[string]bool{}
	for _, sl := range after.Slots {
		if sl.Pod == nil {
			continue
		}
		if seen[sl.Pod.UID] {
			t.Fatalf("pod %s reported twice", sl.Pod.UID)
		}
		seen[sl.Pod.UID] = true
		if bySlot[sl.Pod.UID] != sl.ID+"/"+sl.IP {
			t.Errorf("pod %s moved from %s to %s/%s", sl.Pod.UID, bySlot[sl.Pod.UID], sl.ID, sl.IP)
		}
		if sl.State != runtime.StateBound {
			t.Errorf("pod %s in state %s", sl.Pod.UID, sl.State)
		}
		out, err := sandboxExec(ctx, sl, runtimetest.Token, "echo", "still here")
		if err != nil || out != "still here\n" {
			t.Errorf("pod %s does not answer: %q %v", sl.Pod.UID, out, err)
		}
	}
	if len(seen) != pods {
		t.Fatalf("%d pods after restart, want %d", len(seen), pods)
	}
	// Release everything, stop the agent, and check nothing is left.
	var rg errgroup.Group
	rg.SetLimit(8)
	for uid := range seen {
		rg.Go(func() error { return c.Release(ctx, uid, 0) })
	}
	if err := rg.Wait(); err != nil {
		t.Fatalf("release: %v", err)
	}
	waitInventory("every slot free", func(inv runtime.Inventory) bool { return countReady(inv) == 0 && inv.Count()[runtime.StateBound] == 0 })
	cc := s.Containerd(t, runtimeNamespace)
	// The warm slots' shim groups keep their holders.
	left, err := cc.Containers(ctx, fmt.Sprintf(`labels."%s"==%s,labels."%s"!=true`, noderuntime.LabelNode, node, noderuntime.LabelHolder))
	if err != nil || len(left) != 0 {
		t.Fatalf("%d containers left (%v)", len(left), err)
	}
}

func countReady(inv runtime.Inventory) int {
	n := 0
	for _, s := range inv.Slots {
		if s.State == runtime.StateBound && s.Ready {
			n++
		}
	}
	return n
}

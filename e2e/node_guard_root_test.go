//go:build root

package e2e

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/nodeapi"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// TestRootNodeAPIUnreachableFromSandboxes: with the node API on the bridge
// address sandboxes route to, --guard-from rejects them at that port while
// the host reaches it, and the rule goes when the agent stops.
func TestRootNodeAPIUnreachableFromSandboxes(t *testing.T) {
	s := framework.Get(t)
	bridgeIP := strings.TrimSuffix(s.Env["BRIDGE_CIDR"], ".0.0/16") + ".0.1"
	node := "guard-" + rand.String(6)
	stateDir := filepath.Join(framework.StateDir(), "test-runtimes", node)
	t.Cleanup(func() { _ = os.RemoveAll(stateDir) })

	// An unguarded listener on the same address shows the route exists.
	open, err := net.Listen("tcp", bridgeIP+":0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		_ = http.Serve(open, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("open")) }))
	}()
	t.Cleanup(func() { open.Close() })

	port := freePort(t)
	addr := bridgeIP + ":" + strconv.Itoa(port)
	a := startAgent(t, buildNode(t, s.Root), []string{"--node", node, "--containerd-address", s.ContainerdAddress,
		"--namespace", runtimeNamespace, "--slots", "2", "--warm-slots", "1", "--state-dir", stateDir,
		"--daemon-path", buildDaemon(t, s.Root), "--runc", s.RuncBin, "--cni-conf-dir", s.CNIConfDir, "--cni-bin-dir", s.CNIBinDir,
		"--listen", addr, "--guard-from", s.Env["BRIDGE_CIDR"], "--log-level", "warn",
		// The sandbox firewall would stop the sandbox at the node's address
		// anyway: let it through, so that the guard alone is tested.
		"--sandbox-egress-allow", bridgeIP + "/32"})
	c := nodeapi.NewClient(addr, "pool-secret", nil)
	var slot runtime.Slot
	framework.Eventually(t, time.Minute, "a bind through the agent", func(ctx context.Context) (bool, error) {
		slot, err = c.Bind(ctx, runtimetest.Request("guarded", s.DebianImage))
		return err == nil, nil
	})
	t.Cleanup(func() { _ = c.Release(context.Background(), "guarded", 0) })
	sb := daemonClient(t, slot)
	framework.Eventually(t, time.Minute, "the sandbox to be assigned its pod", func(ctx context.Context) (bool, error) {
		h, err := sb.Health(ctx)
		return err == nil && h.Status == "ok", nil
	})
	wget := func(target string) *api.ExecResult {
		// busybox-static's wget crashes without NSS libraries: use python3.
		res, err := sb.Exec(t.Context(), api.ExecRequest{Cmd: []string{"python3", "-c",
			"import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=3).read().decode(), end='')",
			"http://" + target + "/healthz"}})
		if err != nil {
			t.Fatal(err)
		}
		return &api.ExecResult{ExitCode: res.ExitCode, Stdout: string(res.Stdout), Stderr: string(res.Stderr)}
	}
	if res := wget(open.Addr().String()); res.ExitCode != 0 || res.Stdout != "open" {
		t.Fatalf("the sandbox cannot reach an unguarded port on %s (exit %d, %q): the test proves nothing", bridgeIP, res.ExitCode, res.Stderr)
	}
	if res := wget(addr); res.ExitCode == 0 {
		t.Fatalf("the sandbox reached the node API at %s: %q", addr, res.Stdout)
	}
	if _, err := c.Inventory(t.Context()); err != nil {
		t.Fatalf("the host cannot reach the node API: %v", err)
	}
	rule := []string{"-C", "INPUT", "!", "-i", "lo", "-s", s.Env["BRIDGE_CIDR"], "-p", "tcp", "--dport", strconv.Itoa(port),
		"-m", "comment", "--comment", "sandman-node: sandboxes may not reach the node API", "-j", "REJECT", "--reject-with", "tcp-reset"}
	if err := exec.Command("iptables", rule...).Run(); err != nil {
		t.Fatalf("guard rule not found: %v", err)
	}
	if err := c.Release(t.Context(), "guarded", 0); err != nil {
		t.Fatal(err)
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	<-a.done
	if err := exec.Command("iptables", rule...).Run(); err == nil {
		t.Fatal("guard rule left after the agent stopped")
	}
}

//go:build root

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// TestRootGVisor: a pod whose runtime handler is runsc runs under gVisor's
// kernel with the daemon serving exec and files inside; the slot's firewall
// holds for it as for runc (it reaches neither another sandbox nor the
// node nor metadata, and the node reaches only its declared port); its
// slot, once released, serves a runc pod; and a node without gVisor refuses
// such a pod by name rather than running it under runc.
func TestRootGVisor(t *testing.T) {
	s := framework.Get(t)
	needRunsc(t, s)
	ctx := t.Context()
	const public = "203.0.113.78"
	rt := newContainerdRuntime(t, s, 2, 2, func(c *noderuntime.Config) {
		c.RuncPath, c.RunscPath, c.EgressInternet = s.RuncBin, s.RunscBin, true
	})
	port := publicListener(t, public)
	bridgeIP := strings.TrimSuffix(s.Env["BRIDGE_CIDR"], ".0.0/16") + ".0.1"

	bind := func(uid, handler string, ports ...int32) runtime.Slot {
		t.Helper()
		req := runtimetest.Request(uid, s.DebianImage, "sh", "-c", "echo from-main > /tmp/main; sleep 1000")
		req.RuntimeHandler = handler
		for _, p := range ports {
			req.Containers[0].Ports = append(req.Containers[0].Ports, runtime.Port{Port: p})
		}
		slot, err := rt.Bind(ctx, req)
		if err != nil {
			t.Fatalf("bind %s (%q): %v", uid, handler, err)
		}
		framework.Eventually(t, time.Minute, uid+"'s main process", func(ctx context.Context) (bool, error) {
			out, err := sandboxExec(ctx, slot, runtimetest.Token, "cat", "/tmp/main")
			return err == nil && out == "from-main\n", nil
		})
		return slot
	}
	kernel := func(slot runtime.Slot) string {
		t.Helper()
		out, err := sandboxExec(ctx, slot, runtimetest.Token, "uname", "-r")
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(out)
	}

	framework.Eventually(t, time.Minute, "two warm slots", func(ctx context.Context) (bool, error) {
		inv, err := rt.Inventory(ctx)
		return err == nil && inv.Count()[runtime.StateWarm] == 2, err
	})
	r := bind("gv-runc", "", 8080)
	g := bind("gv-gvisor", runtime.RuntimeHandlerRunsc, 8080)
	if k := kernel(g); !strings.Contains(k, "gvisor") {
		t.Fatalf("uname -r under runsc: %q, want gVisor's kernel", k)
	}
	if k := kernel(r); strings.Contains(k, "gvisor") {
		t.Fatalf("uname -r under runc: %q", k)
	}
	// The daemon's file API inside gVisor.
	dc := daemonClient(t, g)
	if _, err := dc.WriteFile(ctx, "/tmp/put.txt", strings.NewReader("through the sentry"), 0o640); err != nil {
		t.Fatal(err)
	}
	if out, err := sandboxExec(ctx, g, runtimetest.Token, "cat", "/tmp/put.txt"); err != nil || out != "through the sentry" {
		t.Fatalf("file written through the daemon reads %q, %v", out, err)
	}
	// Threads start (glibc's clone3 gets ENOSYS and falls back to clone,
	// as under runc: gVisor's seccomp would answer EPERM).
	if out, err := sandboxExec(ctx, g, runtimetest.Token, "python3", "-c",
		"import threading; t = threading.Thread(target=print, args=('thread ok',)); t.start(); t.join()"); err != nil || out != "thread ok\n" {
		t.Errorf("a thread in the gVisor sandbox: %q, %v", out, err)
	}

	// Outbound from the gVisor sandbox: the slot's firewall holds.
	for _, p := range []string{"8080", "9090"} {
		if _, err := daemonClient(t, r).StartProcess(ctx, api.ProcessRequest{Cmd: []string{"python3", "-m", "http.server", p}}); err != nil {
			t.Fatal(err)
		}
		if _, err := dc.StartProcess(ctx, api.ProcessRequest{Cmd: []string{"python3", "-m", "http.server", p}}); err != nil {
			t.Fatal(err)
		}
	}
	framework.Eventually(t, time.Minute, "the servers", func(ctx context.Context) (bool, error) {
		a, errA := sandboxExec(ctx, r, runtimetest.Token, "python3", "-c", connectScript, "127.0.0.1:8080", "127.0.0.1:9090")
		b, errB := sandboxExec(ctx, g, runtimetest.Token, "python3", "-c", connectScript, "127.0.0.1:8080", "127.0.0.1:9090")
		return errA == nil && errB == nil && strings.Count(a+b, " ok") == 4, nil
	})
	denied := []string{r.IP + ":49983", r.IP + ":8080", bridgeIP + ":" + port, primaryAddr(t) + ":" + port, "169.254.169.254:80"}
	got := connectFrom(t, g, append([]string{public + ":" + port}, denied...)...)
	for _, target := range denied {
		if got[target] == "ok" || got[target] == "" {
			t.Errorf("the gVisor sandbox reached %s: %q", target, got[target])
		}
	}
	if got[public+":"+port] != "ok" {
		t.Errorf("with internet egress, the gVisor sandbox could not reach %s: %q", public, got[public+":"+port])
	}
	// Inbound: the node reaches its declared port only.
	checkInbound(t, g.IP, "8080", "9090")

	// The released slot serves a runc pod (both slots are in use, so the
	// next pod takes the one gVisor ran in).
	if err := rt.Release(ctx, "gv-gvisor", 0); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, time.Minute, "the released slot to be warm", func(ctx context.Context) (bool, error) {
		inv, err := rt.Inventory(ctx)
		return err == nil && inv.Count()[runtime.StateWarm] == 1, err
	})
	next := bind("gv-after", "")
	if next.IP != g.IP {
		t.Fatalf("the runc pod took slot %s (%s), want the released one at %s", next.ID, next.IP, g.IP)
	}
	if k := kernel(next); strings.Contains(k, "gvisor") {
		t.Fatalf("a runc pod in the slot gVisor used runs on %q", k)
	}

	// A node without gVisor refuses the pod, naming what is missing.
	plain := newContainerdRuntime(t, s, 1, 1)
	none := runtimetest.Request("gv-none", s.DebianImage)
	none.RuntimeHandler = runtime.RuntimeHandlerRunsc
	_, err := plain.Bind(ctx, none)
	if err == nil || !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "--runsc") {
		t.Fatalf("bind under runsc on a node without gVisor: %v, want InvalidArgument naming --runsc", err)
	}
}

//go:build root

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// TestRootPodSecurity: the security settings a pod asks for hold inside
// its sandbox, even where a hot sandbox of its image waits (it must not
// take one): a read-only root (the daemon still runs sessions, from its own
// tmpfs), no capabilities, the image's user with the pod's group, a pids
// limit below the node's, a Localhost seccomp profile; runAsNonRoot with an
// image whose user is root fails the bind as InvalidArgument.
func TestRootPodSecurity(t *testing.T) {
	s := framework.Get(t)
	profiles := t.TempDir()
	if err := os.WriteFile(filepath.Join(profiles, "no-mkdir.json"), []byte(`{"defaultAction": "SCMP_ACT_ALLOW",
		"syscalls": [{"names": ["mkdir", "mkdirat"], "action": "SCMP_ACT_ERRNO"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	rt := newContainerdRuntime(t, s, 4, 1, func(c *noderuntime.Config) {
		c.HotSlots, c.HotImages, c.SeccompProfileRoot = 1, []string{s.BusyboxImage}, profiles
	})
	ctx := t.Context()
	framework.Eventually(t, time.Minute, "a hot slot", func(ctx context.Context) (bool, error) {
		inv, err := rt.Inventory(ctx)
		return err == nil && inv.Count()[runtime.StateHot] == 1, err
	})
	ready := func(slot runtime.Slot) {
		framework.Eventually(t, time.Minute, "the sandbox's daemon", func(ctx context.Context) (bool, error) {
			_, err := sandboxExec(ctx, slot, runtimetest.Token, "true")
			return err == nil, nil
		})
	}
	sh := func(slot runtime.Slot, script string) string {
		out, err := sandboxExec(ctx, slot, runtimetest.Token, "sh", "-c", script)
		if err != nil {
			t.Fatalf("%s: %v", script, err)
		}
		return strings.TrimSpace(out)
	}

	group := int64(4242)
	req := runtimetest.Request("podsec-1", s.BusyboxImage)
	c := &req.Containers[0]
	c.ReadOnlyRootFS, c.DropCapabilities, c.Group, c.PidsLimit = true, []string{"ALL"}, &group, 64
	slot, err := rt.Bind(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	ready(slot)
	if out := sh(slot, "touch /x 2>&1; echo rc=$?"); !strings.HasSuffix(out, "rc=1") {
		t.Errorf("touch /x on a read-only root: %q, want a failure", out)
	}
	if out := sh(slot, "grep CapEff /proc/self/status"); !strings.HasSuffix(out, "0000000000000000") {
		t.Errorf("effective capabilities with ALL dropped: %q", out)
	}
	if out := sh(slot, "id -u; id -g"); out != "0\n4242" {
		t.Errorf("id -u; id -g: %q, want the image's user 0 with group 4242", out)
	}
	// The sandbox sees no cgroup files: read its pids cgroup from the host.
	cg := sh(slot, "sed -n 's/^[0-9]*:pids://p' /proc/self/cgroup")
	if b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids", cg, "pids.max")); err != nil || strings.TrimSpace(string(b)) != "64" {
		t.Errorf("pids.max of %s: %q %v, want the pod's 64", cg, b, err)
	}
	// Sessions keep their files on the daemon's tmpfs.
	dc, err := client.New(fmt.Sprintf("%s:%d", slot.IP, api.Port), client.WithToken(runtimetest.Token), client.WithRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	sess, err := dc.CreateSession(ctx, api.SessionRequest{})
	if err != nil {
		t.Fatalf("a session on a read-only root: %v", err)
	}
	if res, err := dc.Run(ctx, sess.ID, api.RunRequest{Command: "echo in-session"}); err != nil || strings.TrimSpace(string(res.Stdout)) != "in-session" {
		t.Fatalf("run in a session on a read-only root: %+v %v", res, err)
	}
	if inv, err := rt.Inventory(ctx); err != nil || inv.Count()[runtime.StateHot] != 1 {
		t.Errorf("the hot sandbox was used for a pod with its own security settings (%d hot, %v)", inv.Count()[runtime.StateHot], err)
	}

	seccompReq := runtimetest.Request("podsec-2", s.BusyboxImage)
	seccompReq.Containers[0].SeccompLocalhost = "no-mkdir.json"
	slot2, err := rt.Bind(ctx, seccompReq)
	if err != nil {
		t.Fatal(err)
	}
	ready(slot2)
	if out := sh(slot2, "mkdir /tmp/d 2>&1; echo rc=$?"); !strings.HasSuffix(out, "rc=1") {
		t.Errorf("mkdir under a profile that refuses it: %q", out)
	}
	missing := runtimetest.Request("podsec-3", s.BusyboxImage)
	missing.Containers[0].SeccompLocalhost = "missing.json"
	if _, err := rt.Bind(ctx, missing); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "missing.json") {
		t.Errorf("a missing seccomp profile: %v, want InvalidArgument naming it", err)
	}

	nonRoot := runtimetest.Request("podsec-4", s.BusyboxImage)
	nonRoot.Containers[0].RunAsNonRoot = true
	if _, err := rt.Bind(ctx, nonRoot); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "runAsNonRoot") {
		t.Errorf("runAsNonRoot with a root image: %v, want InvalidArgument", err)
	}
	nonRoot = runtimetest.Request("podsec-5", s.BusyboxImage)
	nonRoot.Containers[0].RunAsNonRoot, nonRoot.Containers[0].User = true, "1000"
	slot5, err := rt.Bind(ctx, nonRoot)
	if err != nil {
		t.Fatalf("runAsNonRoot as uid 1000: %v", err)
	}
	ready(slot5)
	if out := sh(slot5, "id -u"); out != "1000" {
		t.Errorf("id -u: %q, want 1000", out)
	}
}

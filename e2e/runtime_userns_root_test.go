//go:build root

package e2e

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// runtimeWithUserNS is a containerd runtime with user namespaces on, under
// the pinned runc. A missing runc fails the test: the stack's tools are
// part of the tier, so a missing one is a broken install, not a reason to skip.
func runtimeWithUserNS(t *testing.T, s *framework.Stack, slots, warm int, mutate ...func(*noderuntime.Config)) *noderuntime.Runtime {
	t.Helper()
	if fi, err := os.Stat(s.RuncBin); s.RuncBin == "" || err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("no pinned runc at %q: build it with hack/build-tools.sh runc", s.RuncBin)
	}
	return newContainerdRuntime(t, s, slots, warm, append([]func(*noderuntime.Config){func(c *noderuntime.Config) {
		c.RuncPath, c.UserNamespaces = s.RuncBin, noderuntime.UserNamespacesOn
	}}, mutate...)...)
}

// TestRootUserNamespaceConformance runs the runtime contract's suite with
// every sandbox in a user namespace.
func TestRootUserNamespaceConformance(t *testing.T) {
	s := framework.Get(t)
	runtimetest.Suite(t, func(t *testing.T) runtimetest.Harness {
		return runtimetest.Harness{
			Runtime: runtimeWithUserNS(t, s, 3, 2), Slots: 3, WarmSlots: 2,
			Image: s.BusyboxImage, NoShellImage: s.NoShellImage, MissingImage: s.Registry + "/sandman/nope:missing",
			Exec:    sandboxExec,
			Timeout: 60 * time.Second,
		}
	})
}

// TestRootUserNamespace: with user namespaces on and the pinned runc, root
// in a sandbox is an unprivileged uid of the node, a different one for
// every running sandbox; what it writes is owned by that uid on the node and
// by root inside; the daemon serves exec, files and sessions; a hot slot
// started in a user namespace serves pods that want one; a pod's hostUsers:
// true runs on the node's users. It logs what a user namespace costs a bind.
func TestRootUserNamespace(t *testing.T) {
	s := framework.Get(t)
	rt := runtimeWithUserNS(t, s, 5, 2, func(c *noderuntime.Config) {
		c.HotSlots, c.HotImages = 1, []string{s.BusyboxImage}
	})
	ctx := t.Context()
	cc := s.Containerd(t, runtimeNamespace)
	framework.Eventually(t, time.Minute, "a hot slot", func(ctx context.Context) (bool, error) {
		inv, err := rt.Inventory(ctx)
		return err == nil && inv.Count()[runtime.StateHot] == 1, err
	})
	sh := func(slot runtime.Slot, script string) string {
		t.Helper()
		out, err := sandboxExec(ctx, slot, runtimetest.Token, "sh", "-c", script)
		if err != nil {
			t.Fatalf("exec %q in %s: %v", script, slot.ID, err)
		}
		return strings.TrimSpace(out)
	}
	// hostBase is the host uid that root of the sandbox maps to, as the
	// sandbox sees it in its uid_map ("0 <host> <count>").
	hostBase := func(slot runtime.Slot) (uint64, uint64) {
		t.Helper()
		f := strings.Fields(sh(slot, "cat /proc/self/uid_map"))
		if len(f) != 3 || f[0] != "0" {
			t.Fatalf("uid_map of %s: %q", slot.ID, f)
		}
		base, _ := strconv.ParseUint(f[1], 10, 32)
		n, _ := strconv.ParseUint(f[2], 10, 64)
		return base, n
	}
	hostPid := func(slot runtime.Slot) uint32 {
		t.Helper()
		c, err := cc.LoadContainer(ctx, slot.ID+"-task")
		if err != nil {
			if c, err = cc.LoadContainer(ctx, slot.ID+"-hot"); err != nil {
				t.Fatal(err)
			}
		}
		task, err := c.Task(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		return task.Pid()
	}

	// A generic bind (a pod that drops a capability takes no hot slot;
	// one that only asks for root would take a root hot sandbox).
	gen := runtimetest.Request("userns-gen", s.BusyboxImage, "sh", "-c", "echo from-main > /tmp/written; sleep 1000")
	gen.Containers[0].User = "0:0"
	gen.Containers[0].DropCapabilities = []string{"CAP_SYS_CHROOT"}
	genSlot, err := rt.Bind(ctx, gen)
	if err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 30*time.Second, "the main process to write", func(ctx context.Context) (bool, error) {
		out, err := sandboxExec(ctx, genSlot, runtimetest.Token, "cat", "/tmp/written")
		return err == nil && out == "from-main\n", nil
	})
	if got := sh(genSlot, "id -u; id -g"); got != "0\n0" {
		t.Fatalf("id in the sandbox: %q, want root", got)
	}
	base, size := hostBase(genSlot)
	if base < 1<<31 || size != 65536 {
		t.Fatalf("uid_map of the sandbox: root is host uid %d (%d ids), want the node's range from 2^31, 65536 ids", base, size)
	}
	t.Logf("generic sandbox: root is host uid %d", base)
	// On the node, PID 1 (the daemon) and its children run as that uid.
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", hostPid(genSlot)))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if f := strings.Fields(line); len(f) == 5 && (f[0] == "Uid:" || f[0] == "Gid:") {
			for _, id := range f[1:] {
				if id != strconv.FormatUint(base, 10) {
					t.Fatalf("sandbox's PID 1 on the node: %q, want every id %d", line, base)
				}
			}
		}
	}
	// What the sandbox writes: root's inside, the mapped uid's on the node
	// (in the snapshot's upper directory).
	if got := sh(genSlot, "stat -c %u:%g /tmp/written"); got != "0:0" {
		t.Fatalf("owner of a written file inside: %s, want 0:0", got)
	}
	mounts, err := cc.SnapshotService("overlayfs").Mounts(ctx, genSlot.ID+"-task")
	if err != nil {
		t.Fatal(err)
	}
	upper := ""
	for _, m := range mounts {
		for _, o := range m.Options {
			if v, ok := strings.CutPrefix(o, "upperdir="); ok {
				upper = v
			}
		}
	}
	var st syscall.Stat_t
	if err := syscall.Stat(filepath.Join(upper, "tmp", "written"), &st); err != nil {
		t.Fatalf("the written file in the upper directory %q: %v", upper, err)
	}
	if uint64(st.Uid) != base || uint64(st.Gid) != base {
		t.Fatalf("owner of the written file on the node: %d:%d, want %d:%d", st.Uid, st.Gid, base, base)
	}
	// The image's files are root's inside; the daemon (root's on the node,
	// unmapped) is nobody's and runs.
	if got := sh(genSlot, "stat -c %u /bin/busybox /etc/passwd"); got != "0\n0" {
		t.Fatalf("owner of the image's files inside: %q, want 0", got)
	}
	t.Logf("the daemon inside: %s", sh(genSlot, "ls -ln /.sandman/sandman-daemon"))
	// Root of the sandbox may bind ports below 1024 of its own namespace.
	if got := sh(genSlot, "nc -l -p 80 </dev/null >/dev/null 2>/tmp/nc.err & sleep 0.5; kill $! 2>/dev/null && echo listening || cat /tmp/nc.err"); got != "listening" {
		t.Fatalf("listen on port 80 as root of the sandbox: %q", got)
	}
	// /sys is the slot's: its own interfaces, read-only.
	if got := sh(genSlot, "ls /sys/class/net | sort | tr '\\n' ' '; touch /sys/x 2>/dev/null || echo read-only"); got != "eth0 lo read-only" {
		t.Fatalf("/sys in the sandbox: %q, want the slot's interfaces (eth0 lo), read-only", got)
	}
	// Still no way up: a host-root-only operation fails.
	if got := sh(genSlot, "mknod /tmp/null c 1 3 2>&1 || echo refused"); !strings.Contains(got, "refused") {
		t.Fatalf("mknod in the sandbox: %q", got)
	}

	// The daemon: files and sessions.
	dc, err := client.New(fmt.Sprintf("%s:%d", genSlot.IP, api.Port), client.WithToken(runtimetest.Token), client.WithRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dc.WriteFile(ctx, "/root/uploaded", strings.NewReader("uploaded\n"), 0o640); err != nil {
		t.Fatalf("write a file through the daemon: %v", err)
	}
	rc, err := dc.ReadFile(ctx, "/root/uploaded")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "uploaded\n" || sh(genSlot, "stat -c %u /root/uploaded") != "0" {
		t.Fatalf("read back %q", b)
	}
	sess, err := dc.CreateSession(ctx, api.SessionRequest{})
	if err != nil {
		t.Fatalf("session: %v", err)
	}
	res, err := dc.Run(ctx, sess.ID, api.RunRequest{Command: "cd /tmp && id -u && pwd"})
	if err != nil || string(res.Stdout) != "0\n/tmp\n" {
		t.Fatalf("session run: %+v %v", res, err)
	}
	_ = dc.CloseSession(ctx, sess.ID)

	// The hot slot was started in a user namespace and serves a pod with
	// the default (no hostUsers).
	inv, err := rt.Inventory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hotID := ""
	for _, sl := range inv.Slots {
		if sl.State == runtime.StateHot {
			hotID = sl.ID
		}
	}
	hot := runtimetest.Request("userns-hot", s.BusyboxImage, "sleep", "1000")
	hotSlot, err := rt.Bind(ctx, hot)
	if err != nil {
		t.Fatal(err)
	}
	if hotSlot.ID != hotID {
		t.Fatalf("the default pod took slot %s, not the hot slot %s", hotSlot.ID, hotID)
	}
	framework.Eventually(t, 30*time.Second, "the hot sandbox to answer", func(ctx context.Context) (bool, error) {
		_, err := sandboxExec(ctx, hotSlot, runtimetest.Token, "true")
		return err == nil, nil
	})
	hotBase, _ := hostBase(hotSlot)
	if hotBase < 1<<31 || hotBase == base || sh(hotSlot, "id -u") != "0" {
		t.Fatalf("hot sandbox: root is host uid %d (the generic one's is %d), want another of the node's range", hotBase, base)
	}
	t.Logf("hot sandbox: root is host uid %d", hotBase)

	// hostUsers: true opts out (the node's default is on, not required).
	no := runtimetest.Request("userns-off", s.BusyboxImage, "sleep", "1000")
	no.HostUsers = new(true)
	noSlot, err := rt.Bind(ctx, no)
	if err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 30*time.Second, "the host-users sandbox to answer", func(ctx context.Context) (bool, error) {
		_, err := sandboxExec(ctx, noSlot, runtimetest.Token, "true")
		return err == nil, nil
	})
	if f := strings.Fields(sh(noSlot, "cat /proc/self/uid_map")); !slices.Equal(f, []string{"0", "0", "4294967295"}) {
		t.Fatalf("hostUsers: true: uid_map %q, want the node's", f)
	}
	for _, uid := range []string{"userns-gen", "userns-hot", "userns-off"} {
		if err := rt.Release(ctx, uid, 0); err != nil {
			t.Fatal(err)
		}
	}

	// What a user namespace costs a bind (generic path, same runtime):
	// Bind's return and the Ready event, n binds each, alternating.
	_, events, err := rt.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	took := map[bool][]time.Duration{}
	ready := map[bool][]time.Duration{}
	for i := range 2 * n {
		userNS := i%2 == 0
		req := runtimetest.Request(fmt.Sprintf("userns-bench-%d", i), s.BusyboxImage)
		req.Containers[0].DropCapabilities = []string{"CAP_SYS_CHROOT"} // the generic path
		req.HostUsers = new(!userNS)
		begin := time.Now()
		if _, err := rt.Bind(ctx, req); err != nil {
			t.Fatal(err)
		}
		took[userNS] = append(took[userNS], time.Since(begin))
		runtimetest.WaitEvent(t, events, 30*time.Second, "ready", func(ev runtime.Event) bool {
			return ev.Type == runtime.EventReady && ev.Slot.Pod != nil && ev.Slot.Pod.UID == req.Pod.UID
		})
		ready[userNS] = append(ready[userNS], time.Since(begin))
		if err := rt.Release(ctx, req.Pod.UID, 0); err != nil {
			t.Fatal(err)
		}
	}
	p50 := func(d []time.Duration) time.Duration {
		slices.Sort(d)
		return d[len(d)/2].Round(100 * time.Microsecond)
	}
	t.Logf("generic bind, p50 of %d: user namespace: Bind %v, Ready %v; node's users: Bind %v, Ready %v",
		n, p50(took[true]), p50(ready[true]), p50(took[false]), p50(ready[false]))
}

//go:build root

package e2e

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// statefulServer holds 200 MiB of random bytes in memory and answers each
// connection on port 8080 with their digest, its pid and how many
// connections it took: the same digest and pid, and a count that goes on,
// show the process came back with its memory.
const statefulServer = `
import hashlib, os, socket
data = bytearray(os.urandom(200 << 20))
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080))
s.listen(16)
n = 0
while True:
    c, _ = s.accept()
    n += 1
    c.sendall(("%s %d %d\n" % (hashlib.sha256(data).hexdigest(), os.getpid(), n)).encode())
    c.close()
`

// TestRootGVisorPauseResume: a gVisor sandbox whose process holds 200 MiB
// and listens on a port is paused — checkpointed to the node's disk, no
// process of it left, its slot paused — and resumed: the same process
// answers with the same memory, and the daemon still knows the pod's
// token. A runc sandbox is refused with the reason; a paused pod's release
// removes its checkpoint; a resume whose checkpoint is gone fails as data
// loss and leaves the pod paused.
func TestRootGVisorPauseResume(t *testing.T) {
	s := framework.Get(t)
	needRunsc(t, s)
	ctx := t.Context()
	rt := newContainerdRuntime(t, s, 3, 2, func(c *noderuntime.Config) {
		c.RuncPath, c.RunscPath = s.RuncBin, s.RunscBin
	})
	_, events, err := rt.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bind := func(uid, handler string) runtime.Slot {
		t.Helper()
		req := runtimetest.Request(uid, s.DebianImage, "sleep", "100000")
		req.RuntimeHandler = handler
		req.Containers[0].Ports = []runtime.Port{{Port: 8080}}
		slot, err := rt.Bind(ctx, req)
		if err != nil {
			t.Fatalf("bind %s: %v", uid, err)
		}
		framework.Eventually(t, time.Minute, uid+"'s daemon", func(ctx context.Context) (bool, error) {
			_, err := sandboxExec(ctx, slot, runtimetest.Token, "true")
			return err == nil, nil
		})
		return slot
	}
	ask := func(ip string) (string, error) {
		c, err := net.DialTimeout("tcp", ip+":8080", 5*time.Second)
		if err != nil {
			return "", err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		return bufio.NewReader(c).ReadString('\n')
	}
	state := func(uid string) runtime.SlotState {
		inv, err := rt.Inventory(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, sl := range inv.Slots {
			if sl.Pod != nil && sl.Pod.UID == uid {
				return sl.State
			}
		}
		return ""
	}
	// processes counts the node's processes whose command line names id
	// (runsc's sandbox and gofer carry their container's).
	processes := func(id string) int {
		n := 0
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
			if err == nil && strings.Contains(string(b), id) && !strings.Contains(string(b), "containerd-shim") {
				n++
			}
		}
		return n
	}

	g := bind("pr-gvisor", runtime.RuntimeHandlerRunsc)
	if _, err := daemonClient(t, g).StartProcess(ctx, api.ProcessRequest{Cmd: []string{"python3", "-c", statefulServer}}); err != nil {
		t.Fatal(err)
	}
	var before string
	framework.Eventually(t, 2*time.Minute, "the stateful server", func(ctx context.Context) (bool, error) {
		var err error
		before, err = ask(g.IP)
		return err == nil, nil
	})
	id := g.ID + "-task"
	if processes(id) == 0 {
		t.Fatalf("no process of container %s before the pause", id)
	}

	begin := time.Now()
	res, err := rt.Pause(ctx, "pr-gvisor")
	paused := time.Since(begin)
	if err != nil {
		t.Fatalf("pause: %v", err)
	}
	if res.Bytes < 200<<20 {
		t.Errorf("checkpoint of %d bytes, want at least the 200 MiB the process holds", res.Bytes)
	}
	if st := state("pr-gvisor"); st != runtime.StatePaused {
		t.Fatalf("slot of the paused pod is %q", st)
	}
	if n := processes(id); n != 0 {
		t.Errorf("%d processes of the paused sandbox still run", n)
	}
	if _, err := ask(g.IP); err == nil {
		t.Errorf("the paused sandbox's port answers")
	}
	if again, err := rt.Pause(ctx, "pr-gvisor"); err != nil || again.Bytes != res.Bytes {
		t.Errorf("pausing a paused pod: %+v, %v", again, err)
	}

	begin = time.Now()
	if err := rt.Resume(ctx, "pr-gvisor"); err != nil {
		t.Fatalf("resume: %v", err)
	}
	resumed := time.Since(begin)
	runtimetest.WaitEvent(t, events, time.Minute, "the resumed pod ready", func(ev runtime.Event) bool {
		return ev.Type == runtime.EventReady && ev.Slot.Pod != nil && ev.Slot.Pod.UID == "pr-gvisor"
	})
	ready := time.Since(begin)
	after, err := ask(g.IP)
	if err != nil {
		t.Fatalf("the resumed server: %v", err)
	}
	t.Logf("200 MiB sandbox: paused in %v (checkpoint %d MiB), resumed in %v, ready %v, first answer %v",
		paused.Round(time.Millisecond), res.Bytes>>20, resumed.Round(time.Millisecond), ready.Round(time.Millisecond), time.Since(begin).Round(time.Millisecond))
	b, a := strings.Fields(before), strings.Fields(after)
	if len(a) != 3 || len(b) != 3 || a[0] != b[0] || a[1] != b[1] || a[2] != "2" {
		t.Fatalf("before the pause the server said %q, after %q: want the same digest and pid, connection 2", before, after)
	}
	if out, err := sandboxExec(ctx, g, runtimetest.Token, "echo", "resumed"); err != nil || out != "resumed\n" {
		t.Fatalf("exec in the resumed sandbox: %q, %v", out, err)
	}
	if err := rt.Resume(ctx, "pr-gvisor"); err != nil {
		t.Errorf("resuming a running pod: %v", err)
	}

	// runc cannot keep a sandbox's processes.
	r := bind("pr-runc", "")
	if _, err := rt.Pause(ctx, "pr-runc"); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "CRIU") {
		t.Errorf("pause of a runc sandbox: %v, want FailedPrecondition naming CRIU", err)
	}
	if _, err := sandboxExec(ctx, r, runtimetest.Token, "true"); err != nil {
		t.Errorf("the runc sandbox after its refused pause: %v", err)
	}
	if _, err := rt.Pause(ctx, "pr-nobody"); !errdefs.IsNotFound(err) {
		t.Errorf("pause of an unknown pod: %v, want NotFound", err)
	}

	// A checkpoint that is gone: the resume fails as data loss, the pod
	// stays paused, and its release leaves nothing.
	if _, err := rt.Pause(ctx, "pr-gvisor"); err != nil {
		t.Fatalf("second pause: %v", err)
	}
	dirs, _ := filepath.Glob(filepath.Join(framework.StateDir(), "test-runtimes", "*", "checkpoints", g.ID))
	if len(dirs) != 1 {
		t.Fatalf("checkpoint directories of slot %s: %v", g.ID, dirs)
	}
	if err := os.RemoveAll(dirs[0]); err != nil {
		t.Fatal(err)
	}
	if err := rt.Resume(ctx, "pr-gvisor"); !errdefs.IsDataLoss(err) {
		t.Errorf("resume without its checkpoint: %v, want DataLoss", err)
	}
	if st := state("pr-gvisor"); st != runtime.StatePaused {
		t.Errorf("after a failed resume the slot is %q, want paused", st)
	}
	for _, uid := range []string{"pr-gvisor", "pr-runc"} {
		if err := rt.Release(ctx, uid, 0); err != nil {
			t.Fatalf("release %s: %v", uid, err)
		}
	}
	markers, _ := filepath.Glob(filepath.Join(framework.StateDir(), "test-runtimes", "*", "slots", g.ID, "paused.json"))
	if len(markers) != 0 {
		t.Errorf("the released paused slot keeps its marker: %v", markers)
	}
	framework.Eventually(t, time.Minute, "the slots warm again", func(ctx context.Context) (bool, error) {
		inv, err := rt.Inventory(ctx)
		return err == nil && inv.Count()[runtime.StateWarm] == 3, err
	})
}

// TestRootGVisorPauseDiskFull: a pause whose checkpoint fills the disk
// (a 16 MiB tmpfs for a sandbox holding 64 MiB) fails as ResourceExhausted
// saying so, removes what it wrote, and leaves the sandbox running: the
// same process, its daemon answering, its slot bound.
func TestRootGVisorPauseDiskFull(t *testing.T) {
	s := framework.Get(t)
	needRunsc(t, s)
	ctx := t.Context()
	dir := filepath.Join(t.TempDir(), "checkpoints")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size=16m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	rt := newContainerdRuntime(t, s, 2, 1, func(c *noderuntime.Config) {
		c.RuncPath, c.RunscPath, c.CheckpointDir = s.RuncBin, s.RunscBin, dir
	})
	req := runtimetest.Request("full-1", s.DebianImage, "python3", "-c",
		"import os, time\nb = bytearray(os.urandom(1 << 20)) * 64\nopen('/tmp/held', 'w').write(str(os.getpid()))\ntime.sleep(1e9)\n")
	req.RuntimeHandler = runtime.RuntimeHandlerRunsc
	slot, err := rt.Bind(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var pid string
	framework.Eventually(t, time.Minute, "the process holding 64 MiB", func(ctx context.Context) (bool, error) {
		out, err := sandboxExec(ctx, slot, runtimetest.Token, "cat", "/tmp/held")
		pid = out
		return err == nil && out != "", nil
	})
	_, err = rt.Pause(ctx, "full-1")
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "disk is full") {
		t.Fatalf("pause onto a full disk: %v, want ResourceExhausted saying the disk is full", err)
	}
	t.Logf("pause onto a full disk: %v", err)
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("the failed checkpoint left %d entries", len(left))
	}
	inv, _ := rt.Inventory(ctx)
	for _, sl := range inv.Slots {
		if sl.Pod != nil && sl.Pod.UID == "full-1" && sl.State != runtime.StateBound {
			t.Errorf("after the failed pause the slot is %s", sl.State)
		}
	}
	out, err := sandboxExec(ctx, slot, runtimetest.Token, "sh", "-c", "kill -0 "+pid+" && echo alive")
	if err != nil || out != "alive\n" {
		t.Fatalf("the sandbox after the failed pause: %q, %v", out, err)
	}
	if err := rt.Release(ctx, "full-1", 0); err != nil {
		t.Fatal(err)
	}
}

// TestRootGVisorFork: three binds of one fork of a running gVisor sandbox
// (a process holding 200 MiB and serving a port, a file in its writable
// layer) each start from the same moment: the same process with the same
// memory answers in each, at the fork's own address, going on from the
// source's count; the file is there. Then they diverge: a file written in
// one fork is in no other sandbox, and each answers its own count. Each
// fork takes its own token and refuses the source's; the source runs on.
// A fork of a runc sandbox is refused naming CRIU, one whose memory limit
// is below its source's use as InvalidArgument, one of another image
// as invalid; releasing the source removes the fork's checkpoint.
func TestRootGVisorFork(t *testing.T) {
	s := framework.Get(t)
	needRunsc(t, s)
	ctx := t.Context()
	ckdir := filepath.Join(t.TempDir(), "checkpoints")
	rt := newContainerdRuntime(t, s, 6, 2, func(c *noderuntime.Config) {
		c.RuncPath, c.RunscPath, c.CheckpointDir = s.RuncBin, s.RunscBin, ckdir
	})
	ready := func(uid string) {
		t.Helper()
		framework.Eventually(t, 2*time.Minute, uid+" ready", func(ctx context.Context) (bool, error) {
			inv, err := rt.Inventory(ctx)
			if err != nil {
				return false, err
			}
			for _, sl := range inv.Slots {
				if sl.Pod != nil && sl.Pod.UID == uid {
					return sl.Ready, nil
				}
			}
			return false, nil
		})
	}
	ask := func(ip string) []string { return askServer(t, ip) }
	forkReq := func(uid, token, source, id string) runtime.BindRequest {
		req := runtimetest.Request(uid, s.DebianImage, "sleep", "100000")
		req.RuntimeHandler = runtime.RuntimeHandlerRunsc
		req.Containers[0].Ports = []runtime.Port{{Port: 8080}}
		sum := sha256.Sum256([]byte(token))
		req.TokenHashes = []string{hex.EncodeToString(sum[:])}
		req.Fork = &runtime.ForkSource{PodUID: source, ID: id}
		return req
	}

	src := forkReq("fk-source", runtimetest.Token, "", "")
	src.Fork = nil
	srcSlot, err := rt.Bind(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	ready("fk-source")
	if _, err := daemonClient(t, srcSlot).StartProcess(ctx, api.ProcessRequest{Cmd: []string{"python3", "-c", statefulServer}}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 2*time.Minute, "the stateful server", func(ctx context.Context) (bool, error) {
		c, err := net.DialTimeout("tcp", srcSlot.IP+":8080", time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil, nil
	})
	before := ask(srcSlot.IP) // connection 2 (the poll took 1)
	if _, err := sandboxExec(ctx, srcSlot, runtimetest.Token, "sh", "-c", "echo from-source > /root/note"); err != nil {
		t.Fatal(err)
	}

	const n = 3
	slots := make([]runtime.Slot, n)
	errs := make(chan error, n)
	begin := time.Now()
	for i := range n {
		go func() {
			var err error
			slots[i], err = rt.Bind(ctx, forkReq(fmt.Sprintf("fk-%d", i), fmt.Sprintf("fork-token-%d", i), "fk-source", "batch1"))
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("fork bind: %v", err)
		}
	}
	for i := range n {
		ready(fmt.Sprintf("fk-%d", i))
	}
	t.Logf("%d forks of a 200 MiB sandbox bound and ready in %v", n, time.Since(begin).Round(time.Millisecond))
	for i, sl := range slots {
		if sl.IP == srcSlot.IP {
			t.Fatalf("fork %d has its source's address %s", i, sl.IP)
		}
		got := ask(sl.IP)
		// The source had answered 2 connections at the fork.
		if len(got) != 3 || got[0] != before[0] || got[1] != before[1] || got[2] != "3" {
			t.Errorf("fork %d's server said %q, the source's before the fork %q: want the same digest and pid, connection 3", i, got, before)
		}
		tok := fmt.Sprintf("fork-token-%d", i)
		if out, err := sandboxExec(ctx, sl, tok, "cat", "/root/note"); err != nil || out != "from-source\n" {
			t.Errorf("fork %d's /root/note: %q, %v", i, out, err)
		}
		if _, err := sandboxExec(ctx, sl, runtimetest.Token, "true"); err == nil {
			t.Errorf("fork %d takes its source's token", i)
		}
	}
	if _, err := sandboxExec(ctx, srcSlot, "fork-token-0", "true"); err == nil {
		t.Errorf("the source takes a fork's token")
	}
	// They diverge.
	if _, err := sandboxExec(ctx, slots[0], "fork-token-0", "sh", "-c", "echo mine > /root/only-0"); err != nil {
		t.Fatal(err)
	}
	for i, sl := range slots[1:] {
		if out, err := sandboxExec(ctx, sl, fmt.Sprintf("fork-token-%d", i+1), "sh", "-c", "cat /root/only-0 2>&1 || true"); err != nil || !strings.Contains(out, "No such file") {
			t.Errorf("fork %d sees fork 0's file: %q %v", i+1, out, err)
		}
	}
	if out, err := sandboxExec(ctx, srcSlot, runtimetest.Token, "sh", "-c", "cat /root/only-0 2>&1 || true"); err != nil || !strings.Contains(out, "No such file") {
		t.Errorf("the source sees fork 0's file: %q %v", out, err)
	}
	if got := ask(slots[0].IP); len(got) != 3 || got[2] != "4" {
		t.Errorf("fork 0's second answer %q, want its connection 4", got)
	}
	if got := ask(srcSlot.IP); len(got) != 3 || got[2] != "3" {
		t.Errorf("the source after the fork said %q, want its connection 3", got)
	}
	dirs, _ := filepath.Glob(filepath.Join(ckdir, "fork-*"))
	if len(dirs) != 1 {
		t.Errorf("fork checkpoints on the node: %v, want one", dirs)
	}

	// Refusals.
	bad := forkReq("fk-bad-image", "x", "fk-source", "batch2")
	bad.Containers[0].Image = s.BusyboxImage
	if _, err := rt.Bind(ctx, bad); !errdefs.IsInvalidArgument(err) {
		t.Errorf("a fork of another image: %v, want InvalidArgument", err)
	}
	small := forkReq("fk-small", "x", "fk-source", "batch2")
	small.Containers[0].Limits.MemoryBytes = 64 << 20 // the source holds 200 MiB
	if _, err := rt.Bind(ctx, small); !errdefs.IsInvalidArgument(err) || !strings.Contains(err.Error(), "below") {
		t.Errorf("a fork with a memory limit below its source's use: %v, want InvalidArgument", err)
	}
	runcReq := runtimetest.Request("fk-runc", s.DebianImage, "sleep", "100000")
	if _, err := rt.Bind(ctx, runcReq); err != nil {
		t.Fatal(err)
	}
	ready("fk-runc")
	if _, err := rt.Bind(ctx, forkReq("fk-of-runc", "x", "fk-runc", "b")); !errdefs.IsFailedPrecondition(err) || !strings.Contains(err.Error(), "CRIU") {
		t.Errorf("a fork of a runc sandbox: %v, want FailedPrecondition naming CRIU", err)
	}
	if _, err := rt.Bind(ctx, forkReq("fk-of-nobody", "x", "fk-nobody", "b")); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("a fork of an unknown pod: %v, want FailedPrecondition", err)
	}
	// A fork whose spec is not its source's (another command): runsc's
	// restore refuses it, the bind fails saying so, and its container goes
	// (the census at the end checks nothing is left).
	other := forkReq("fk-other-cmd", "x", "fk-source", "batch3")
	other.Containers[0].Command = []string{"sleep", "5"}
	if _, err := rt.Bind(ctx, other); err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Errorf("a fork with another command: %v, want runsc's refusal", err)
	}

	for _, uid := range []string{"fk-source", "fk-runc", "fk-0", "fk-1", "fk-2"} {
		if err := rt.Release(ctx, uid, 0); err != nil {
			t.Fatalf("release %s: %v", uid, err)
		}
	}
	if left, _ := os.ReadDir(ckdir); len(left) != 0 {
		t.Errorf("after every release the checkpoint directory holds %d entries", len(left))
	}
}

//go:build root

package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"golang.org/x/sys/unix"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// tickScript is a sandbox's main process that writes the time every 50 ms:
// a sandbox that runs (not frozen) moves it.
const tickScript = "while :; do date +%s%N > /tmp/tick; sleep 0.05; done"

// snapshotProgress records the progress calls of a snapshot.
type snapshotProgress struct {
	mu    sync.Mutex
	calls []runtime.SnapshotProgress
}

func (p *snapshotProgress) add(sp runtime.SnapshotProgress) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, sp)
}

// phases are the phases seen, each once, in order.
func (p *snapshotProgress) phases() []runtime.SnapshotPhase {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []runtime.SnapshotPhase
	for _, c := range p.calls {
		if len(out) == 0 || out[len(out)-1] != c.Phase {
			out = append(out, c.Phase)
		}
	}
	return out
}

// last is the last call of phase.
func (p *snapshotProgress) last(phase runtime.SnapshotPhase) runtime.SnapshotProgress {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out runtime.SnapshotProgress
	for _, c := range p.calls {
		if c.Phase == phase {
			out = c
		}
	}
	return out
}

// taskStatus is the status of the task of a pod's container.
func taskStatus(t *testing.T, cc *ctrd.Client, id string) ctrd.ProcessStatus {
	t.Helper()
	ctx := t.Context()
	c, err := cc.LoadContainer(ctx, id)
	if err != nil {
		t.Fatalf("container %s: %v", id, err)
	}
	task, err := c.Task(ctx, nil)
	if err != nil {
		t.Fatalf("task of %s: %v", id, err)
	}
	st, err := task.Status(ctx)
	if err != nil {
		t.Fatalf("status of %s: %v", id, err)
	}
	return st.Status
}

// TestRootSnapshot: a Debian sandbox in a user namespace writes, deletes
// and replaces files; a snapshot of it is pushed to the registry while the
// sandbox keeps running (frozen briefly); a fork bound on the same node
// from the snapshot pulls nothing and sees the files as the original did:
// owners as inside (root's files root's, a file given to uid 1000 still
// 1000's), the deleted file gone, the replaced directory holding only its
// new contents.
func TestRootSnapshot(t *testing.T) {
	s := framework.Get(t)
	proxy := startRegistryProxy(t, s.Registry)
	rt := runtimeWithUserNS(t, s, 3, 1, func(c *noderuntime.Config) {
		c.SnapshotRegistry = proxy.Host + "/sandman-e2e"
	})
	ctx := t.Context()
	cc := s.Containerd(t, runtimeNamespace)
	sh := func(slot runtime.Slot, script string) string {
		t.Helper()
		var out string
		framework.Eventually(t, time.Minute, "exec "+script, func(ctx context.Context) (bool, error) {
			var err error
			out, err = sandboxExec(ctx, slot, runtimetest.Token, "sh", "-c", script)
			return err == nil, nil
		})
		return strings.TrimSpace(out)
	}

	orig, err := rt.Bind(ctx, runtimetest.Request("snap-orig", s.DebianImage, "sh", "-c", tickScript))
	if err != nil {
		t.Fatal(err)
	}
	mb := 8
	if v, err := strconv.Atoi(os.Getenv("SANDMAN_TEST_SNAPSHOT_MB")); err == nil && v > 0 {
		mb = v // a larger sandbox, to measure the freeze
	}
	sh(orig, fmt.Sprintf(`set -e
head -c %dM /dev/urandom > /root/big
mkdir -p /work/sub && echo hello > /work/sub/hello && echo root > /work/root-owned
echo thousand > /work/u1000 && chown 1000:1000 /work/u1000
rm /etc/issue.net
rm -rf /etc/apt/apt.conf.d && mkdir /etc/apt/apt.conf.d && echo new > /etc/apt/apt.conf.d/only-this`, mb))
	wantSum := sh(orig, "md5sum < /root/big")

	name := fmt.Sprintf("snap-%s:v1", rand.String(6))
	var prog snapshotProgress
	res, err := rt.Snapshot(ctx, runtime.SnapshotRequest{PodUID: "snap-orig", Image: name}, prog.add)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// After the runtime's cleanup (cleanups run last first): no pod uses them.
		for _, img := range []string{res.Image, proxy.Host + "/sandman-e2e/during-release:v1"} {
			if err := cc.ImageService().Delete(context.Background(), img, images.SynchronousDelete()); err != nil && !errdefs.IsNotFound(err) {
				t.Errorf("remove the snapshot image %s: %v", img, err)
			}
		}
	})
	t.Logf("snapshot of %d MiB written: %s, frozen %v, took %v; diff %d bytes, layer %d bytes",
		mb, res.Image, res.Frozen, res.Duration, res.DiffBytes, res.LayerBytes)
	if want := proxy.Host + "/sandman-e2e/" + name; res.Image != want || !strings.HasPrefix(res.Digest, "sha256:") ||
		res.BaseImage == "" || !strings.HasPrefix(res.Layer, "sha256:") {
		t.Fatalf("result %+v, want image %s", res, want)
	}
	if res.Frozen <= 0 || res.Frozen >= res.Duration {
		t.Errorf("frozen %v of %v", res.Frozen, res.Duration)
	}
	if res.DiffBytes < int64(mb)<<20 || res.LayerBytes < int64(mb)<<20 { // random data does not compress
		t.Errorf("diff %d bytes, layer %d bytes: want at least the %d MiB written", res.DiffBytes, res.LayerBytes, mb)
	}
	if got, want := prog.phases(), []runtime.SnapshotPhase{runtime.SnapshotFreeze, runtime.SnapshotDiff,
		runtime.SnapshotCommit, runtime.SnapshotPush, runtime.SnapshotDone}; !slices.Equal(got, want) {
		t.Errorf("phases %v, want %v", got, want)
	}
	if p := prog.last(runtime.SnapshotDiff); p.BytesDone < int64(mb)<<20 {
		t.Errorf("last diff progress %+v", p)
	}
	if p := prog.last(runtime.SnapshotPush); p.BytesTotal <= 0 || p.BytesDone != p.BytesTotal {
		t.Errorf("last push progress %+v", p)
	}
	// The original runs on.
	if st := taskStatus(t, cc, orig.ID+"-task"); st != ctrd.Running {
		t.Fatalf("the original's task is %s after the snapshot", st)
	}
	tick := sh(orig, "cat /tmp/tick")
	framework.Eventually(t, 10*time.Second, "the original's main process to move on", func(ctx context.Context) (bool, error) {
		out, err := sandboxExec(ctx, orig, runtimetest.Token, "cat", "/tmp/tick")
		return err == nil && strings.TrimSpace(out) != tick, nil
	})
	if got := statusOf(rt.Images().Statuses(ctx), res.Image); got.State != runtime.ImageReady {
		t.Errorf("the snapshot in the node's image list: %+v", got)
	}
	inv, err := rt.Inventory(ctx)
	if err != nil || !slices.Contains(inv.ReadyImages, res.Image) {
		t.Errorf("the snapshot is not among the node's ready images: %v (%v)", inv.ReadyImages, err)
	}

	// A fork from the snapshot, on this node: nothing to pull.
	gets := proxy.BlobGets()
	fork, err := rt.Bind(ctx, runtimetest.Request("snap-fork", res.Image, "sleep", "infinity"))
	if err != nil {
		t.Fatal(err)
	}
	if n := proxy.BlobGets() - gets; n != 0 {
		t.Errorf("the fork fetched %d blobs from the registry: the snapshot should be on the node", n)
	}
	checks := []struct{ script, want string }{
		{"id -u", "0"},
		{"md5sum < /root/big", wantSum},
		{"stat -c %u:%g /root/big /work/sub/hello /work/root-owned | sort -u", "0:0"},
		{"stat -c %u:%g /work/u1000", "1000:1000"},
		{"cat /work/sub/hello", "hello"},
		{"test -e /etc/issue.net && echo there || echo gone", "gone"},
		{"ls /etc/apt/apt.conf.d", "only-this"},
		{"cat /etc/debian_version >/dev/null && echo ok", "ok"}, // the base is there
	}
	for _, c := range checks {
		if got := sh(fork, c.script); got != c.want {
			t.Errorf("fork: %s: %q, want %q", c.script, got, c.want)
		}
	}

	// A release that arrives while the sandbox is frozen waits until its
	// changes are written (the sandbox runs again), not for the push.
	var (
		mu                    sync.Mutex
		committed, releasedAt time.Time
		released              = make(chan error, 1)
	)
	_, err = rt.Snapshot(ctx, runtime.SnapshotRequest{PodUID: "snap-orig", Image: "during-release:v1"}, func(p runtime.SnapshotProgress) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case p.Phase == runtime.SnapshotFreeze:
			go func() {
				err := rt.Release(context.WithoutCancel(ctx), "snap-orig", 0)
				mu.Lock()
				releasedAt = time.Now()
				mu.Unlock()
				released <- err
			}()
		case p.Phase == runtime.SnapshotCommit && committed.IsZero():
			committed = time.Now()
		}
	})
	if err != nil {
		t.Fatalf("a snapshot during a release: %v", err)
	}
	if err := <-released; err != nil {
		t.Fatalf("release during a snapshot: %v", err)
	}
	mu.Lock()
	if releasedAt.Before(committed) {
		t.Errorf("the release returned at %v, before the changes were written (%v)", releasedAt, committed)
	}
	mu.Unlock()

	// Bad input.
	if _, err := rt.Snapshot(ctx, runtime.SnapshotRequest{PodUID: "no-such-pod", Image: "x:v1"}, nil); !errdefs.IsNotFound(err) {
		t.Errorf("snapshot of an unknown pod: %v, want NotFound", err)
	}
	if _, err := rt.Snapshot(ctx, runtime.SnapshotRequest{PodUID: "snap-fork", Image: "docker.io/library/x:v1"}, nil); !errdefs.IsInvalidArgument(err) ||
		!strings.Contains(err.Error(), proxy.Host+"/sandman-e2e") {
		t.Errorf("snapshot to another registry: %v, want InvalidArgument naming the snapshot registry", err)
	}
	if _, err := rt.Snapshot(ctx, runtime.SnapshotRequest{PodUID: "snap-fork", Container: "nope", Image: "x:v1"}, nil); !errdefs.IsInvalidArgument(err) {
		t.Errorf("snapshot of an unknown container: %v, want InvalidArgument", err)
	}
}

// TestRootSnapshotFailures: a registry that refuses the push and a disk
// that fills leave the sandbox running (not frozen) and no image on the
// node, with the error's class and what happened.
func TestRootSnapshotFailures(t *testing.T) {
	s := framework.Get(t)
	auth := startAuthRegistry(t, s, "snapper", "secret")
	scratch := t.TempDir()
	if err := unix.Mount("tmpfs", scratch, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m"); err != nil {
		t.Fatalf("mount a 1 MiB tmpfs: %v", err)
	}
	t.Cleanup(func() { _ = unix.Unmount(scratch, unix.MNT_DETACH) })
	rt := runtimeWithUserNS(t, s, 2, 1, func(c *noderuntime.Config) {
		c.SnapshotRegistry, c.SnapshotScratchDir = auth, scratch
	})
	ctx := t.Context()
	cc := s.Containerd(t, runtimeNamespace)
	slot, err := rt.Bind(ctx, runtimetest.Request("snap-fail", s.DebianImage, "sh", "-c", tickScript))
	if err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, time.Minute, "the sandbox to answer", func(ctx context.Context) (bool, error) {
		_, err := sandboxExec(ctx, slot, runtimetest.Token, "sh", "-c", "echo small > /root/small")
		return err == nil, nil
	})
	running := func(what string) {
		t.Helper()
		if st := taskStatus(t, cc, slot.ID+"-task"); st != ctrd.Running {
			t.Fatalf("after %s the sandbox's task is %s, want running", what, st)
		}
		out, err := sandboxExec(ctx, slot, runtimetest.Token, "cat", "/root/small")
		if err != nil || strings.TrimSpace(out) != "small" {
			t.Fatalf("after %s the sandbox does not answer: %q %v", what, out, err)
		}
	}
	noImage := func(what, name string) {
		t.Helper()
		if _, err := cc.GetImage(ctx, name); !errdefs.IsNotFound(err) {
			t.Errorf("after %s the image %s is on the node: %v", what, name, err)
		}
		if slices.Contains(rt.Images().Ready(), name) {
			t.Errorf("after %s the image %s is among the node's ready images", what, name)
		}
	}

	// The registry wants credentials the node does not have.
	name := auth + "/sandman-e2e/refused:v1"
	var prog snapshotProgress
	_, err = rt.Snapshot(ctx, runtime.SnapshotRequest{PodUID: "snap-fail", Image: name}, prog.add)
	if !errdefs.IsUnauthorized(err) && !errdefs.IsPermissionDenied(err) || !strings.Contains(err.Error(), auth) {
		t.Fatalf("push refused: %v, want Unauthenticated or PermissionDenied naming %s", err, auth)
	}
	t.Logf("push refused: %v", err)
	if !slices.Contains(prog.phases(), runtime.SnapshotPush) {
		t.Errorf("phases %v: the push was not tried", prog.phases())
	}
	running("a refused push")
	noImage("a refused push", name)

	// The scratch directory (1 MiB) cannot hold 5 MB of changes.
	if _, err := sandboxExec(ctx, slot, runtimetest.Token, "sh", "-c", "head -c 5M /dev/urandom > /root/five"); err != nil {
		t.Fatal(err)
	}
	name = auth + "/sandman-e2e/full:v1"
	_, err = rt.Snapshot(ctx, runtime.SnapshotRequest{PodUID: "snap-fail", Image: name}, nil)
	if !errdefs.IsResourceExhausted(err) || !strings.Contains(err.Error(), "disk is full") {
		t.Fatalf("disk full: %v, want ResourceExhausted", err)
	}
	t.Logf("disk full: %v", err)
	running("a full disk")
	noImage("a full disk", name)
	if entries, _ := os.ReadDir(scratch); len(entries) > 0 {
		t.Errorf("%d files left in the scratch directory", len(entries))
	}
}

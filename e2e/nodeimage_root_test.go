//go:build root

package e2e

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/nodeimage"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/nodeapi"
)

// imageNamespace gives a test its own containerd namespace, so every image
// starts uncached, and removes what the test pulled when it ends.
func imageNamespace(t *testing.T, s *framework.Stack) (*ctrd.Client, string) {
	t.Helper()
	ns := "sandman-img-" + rand.String(6)
	cc := s.Containerd(t, ns)
	t.Cleanup(func() {
		ctx := namespaces.WithNamespace(context.Background(), ns)
		if cs, err := cc.ContainerService().List(ctx); err == nil {
			for _, c := range cs {
				_ = cc.ContainerService().Delete(ctx, c.ID)
			}
		}
		if ls, err := cc.LeasesService().List(ctx); err == nil {
			for _, l := range ls {
				_ = cc.LeasesService().Delete(ctx, l)
			}
		}
		imgs, _ := cc.ImageService().List(ctx)
		for i, img := range imgs {
			var opts []images.DeleteOpt
			if i == len(imgs)-1 {
				opts = append(opts, images.SynchronousDelete())
			}
			_ = cc.ImageService().Delete(ctx, img.Name, opts...)
		}
		if err := cc.NamespaceService().Delete(ctx, ns); err != nil {
			t.Logf("namespace %s left: %v", ns, err)
		}
	})
	return cc, ns
}

func newImageManager(t *testing.T, cc *ctrd.Client, ns string, mutate ...func(*nodeimage.Config)) *nodeimage.Manager {
	t.Helper()
	level := slog.LevelWarn
	if os.Getenv("SANDMAN_TEST_DEBUG") != "" {
		level = slog.LevelDebug
	}
	cfg := nodeimage.Config{Client: cc, Namespace: ns, Node: "img-test",
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))}
	for _, m := range mutate {
		m(&cfg)
	}
	m, err := nodeimage.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestRootImageOnePullForManyBinds: 100 concurrent Ensure calls for one
// uncached image make one pull: every blob is fetched from the registry
// exactly once, all callers get the same unpacked image, and progress
// reaches the total.
func TestRootImageOnePullForManyBinds(t *testing.T) {
	s := framework.Get(t)
	proxy := startRegistryProxy(t, s.Registry)
	img := pushRandomImage(t, s.Registry, "sandman-test/one-pull", rand.String(8), 3, 2<<20, "", "")
	ref := proxy.Host + "/sandman-test/one-pull:" + img.Ref[len(img.Ref)-8:]
	cc, ns := imageNamespace(t, s)
	var (
		mu   sync.Mutex
		last nodeimage.Progress
	)
	m := newImageManager(t, cc, ns, func(c *nodeimage.Config) {
		c.ProgressInterval = 50 * time.Millisecond
		c.OnProgress = func(p nodeimage.Progress) { mu.Lock(); last = p; mu.Unlock() }
	})

	const callers = 100
	digests := make([]string, callers)
	errs := make([]error, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			got, err := m.Ensure(t.Context(), ref, nil)
			if err == nil {
				digests[i] = got.Target().Digest.String()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	if distinct := slices.Compact(slices.Sorted(slices.Values(digests))); len(distinct) != 1 {
		t.Fatalf("callers got different images: %v", distinct)
	}
	if got := proxy.BlobGets(); got != int64(img.Blobs) {
		t.Fatalf("registry served %d blob downloads for %d callers, want %d (each blob once)", got, callers, img.Blobs)
	}
	ctx := namespaces.WithNamespace(t.Context(), ns)
	got, err := cc.GetImage(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := got.IsUnpacked(ctx, "overlayfs"); err != nil || !ok {
		t.Fatalf("image not unpacked: %v", err)
	}
	mu.Lock()
	p := last
	mu.Unlock()
	if !p.Done || p.Err != nil || p.BytesTotal < img.Bytes-1024 || p.BytesDone != p.BytesTotal {
		t.Fatalf("last progress %+v: want done with all %d bytes", p, img.Bytes)
	}
	if !slices.Contains(m.Ready(), ref) {
		t.Fatalf("ready images %v lack %s", m.Ready(), ref)
	}
	// Cached now: another Ensure downloads nothing.
	if _, err := m.Ensure(t.Context(), ref, nil); err != nil || proxy.BlobGets() != int64(img.Blobs) {
		t.Fatalf("second Ensure: %v, %d blob downloads in all", err, proxy.BlobGets())
	}
}

// TestRootImageAuthAndMissing: a registry that wants credentials refuses a
// pull without them (or with wrong ones) clearly and at once, and serves it
// with the pod's docker config; a missing tag fails as not found within
// seconds, and a registry that is down fails as unreachable after its
// retries.
func TestRootImageAuthAndMissing(t *testing.T) {
	s := framework.Get(t)
	host := startAuthRegistry(t, s, "trainer", "s3cret")
	img := pushRandomImage(t, host, "private/task", "v1", 1, 256<<10, "trainer", "s3cret")
	cc, ns := imageNamespace(t, s)
	m := newImageManager(t, cc, ns, func(c *nodeimage.Config) { c.RetryBackoff = 100 * time.Millisecond })

	for name, secrets := range map[string][][]byte{
		"no secret":    nil,
		"wrong secret": {dockerConfig(host, "trainer", "wrong")},
	} {
		begin := time.Now()
		_, err := m.Ensure(t.Context(), img.Ref, secrets)
		if nodeimage.KindOf(err) != nodeimage.KindUnauthorized {
			t.Fatalf("%s: %v, want unauthorized", name, err)
		}
		if took := time.Since(begin); took > 5*time.Second {
			t.Errorf("%s: refused after %s; a refusal is not retried", name, took)
		}
		t.Logf("%s: %v", name, err)
	}
	if _, err := m.Ensure(t.Context(), img.Ref, [][]byte{dockerConfig(host, "trainer", "s3cret")}); err != nil {
		t.Fatalf("with the right secret: %v", err)
	}

	begin := time.Now()
	_, err := m.Ensure(t.Context(), s.Registry+"/sandman-test/does-not-exist:nope", nil)
	if nodeimage.KindOf(err) != nodeimage.KindNotFound {
		t.Fatalf("missing tag: %v, want not found", err)
	}
	if took := time.Since(begin); took > 5*time.Second {
		t.Errorf("missing tag reported after %s", took)
	}
	st := statusOf(m.Statuses(t.Context()), s.Registry+"/sandman-test/does-not-exist:nope")
	if st.State != runtime.ImageFailed || st.ErrorKind != string(nodeimage.KindNotFound) || st.Error == "" {
		t.Errorf("status of the missing image: %+v", st)
	}

	_, err = m.Ensure(t.Context(), "127.0.0.1:"+strconv.Itoa(freePort(t))+"/x/y:z", nil)
	if nodeimage.KindOf(err) != nodeimage.KindUnreachable {
		t.Fatalf("registry down: %v, want unreachable", err)
	}
}

// TestRootImageGCKeepsImagesInUse: over budget, GC removes the least
// recently used images that no container uses until usage fits, and never
// an image a container uses, even the oldest.
func TestRootImageGCKeepsImagesInUse(t *testing.T) {
	s := framework.Get(t)
	cc, ns := imageNamespace(t, s)
	tag := rand.String(6)
	var refs []string
	for _, name := range []string{"a", "b", "c"} {
		refs = append(refs, pushRandomImage(t, s.Registry, "sandman-test/gc-"+name, tag, 1, 2<<20, "", "").Ref)
	}
	m := newImageManager(t, cc, ns)
	ctx := namespaces.WithNamespace(t.Context(), ns)
	for _, ref := range refs { // a is the least recently used
		if _, err := m.Ensure(ctx, ref, nil); err != nil {
			t.Fatal(err)
		}
	}
	// a is in use: a container made from it.
	a, err := cc.GetImage(ctx, refs[0])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cc.NewContainer(ctx, "gc-user-"+tag, ctrd.WithImage(a), ctrd.WithNewSnapshot("gc-user-"+tag, a),
		ctrd.WithNewSpec()); err != nil {
		t.Fatal(err)
	}
	if removed, err := m.GC(ctx); err != nil || len(removed) > 0 {
		t.Fatalf("without a budget GC removed %v (%v)", removed, err)
	}
	u := m.Usage(ctx)
	if u.Images != 3 || u.Bytes < 3*2<<20 {
		t.Fatalf("usage %+v: want 3 images measured", u)
	}
	per := u.Bytes / 3

	// A budget for about one and a half images: b and c must go, a stays.
	m2 := newImageManager(t, cc, ns, func(c *nodeimage.Config) { c.CacheBytes = per * 3 / 2 })
	for _, ref := range refs { // the same order of use
		if _, err := m2.Ensure(ctx, ref, nil); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := m2.GC(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(removed, refs[1:]) {
		t.Fatalf("GC removed %v, want %v (least recently used first, never the image in use)", removed, refs[1:])
	}
	if u := m2.Usage(ctx); u.Bytes > u.Budget || u.Images != 1 {
		t.Fatalf("usage after GC %+v: want within budget with one image", u)
	}
	if ok, err := a.IsUnpacked(ctx, "overlayfs"); err != nil || !ok {
		t.Fatalf("the image in use lost its layers: %v", err)
	}
	for _, ref := range refs[1:] {
		if _, err := cc.GetImage(ctx, ref); err == nil {
			t.Errorf("%s still in containerd after GC", ref)
		}
	}
}

// TestRootImageKilledMidPull: sandman-node killed while it pre-pulls leaves
// no image that binds would use; the next Ensure completes it.
func TestRootImageKilledMidPull(t *testing.T) {
	s := framework.Get(t)
	proxy := startRegistryProxy(t, s.Registry)
	proxy.bytesPerSecond.Store(2 << 20)
	tag := rand.String(8)
	img := pushRandomImage(t, s.Registry, "sandman-test/killed", tag, 3, 3<<20, "", "")
	ref := proxy.Host + "/sandman-test/killed:" + tag
	cc, ns := imageNamespace(t, s)

	node := "img-" + rand.String(6)
	stateDir := filepath.Join(framework.StateDir(), "test-runtimes", node)
	t.Cleanup(func() { _ = os.RemoveAll(stateDir) })
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	bin := buildNode(t, s.Root)
	args := []string{"--node", node, "--containerd-address", s.ContainerdAddress,
		"--namespace", ns, "--slots", "1", "--warm-slots", "1", "--state-dir", stateDir,
		"--daemon-path", buildDaemon(t, s.Root), "--runc", s.RuncBin, "--cni-conf-dir", s.CNIConfDir, "--cni-bin-dir", s.CNIBinDir,
		"--listen", addr, "--prepull", ref, "--log-level", "warn"}
	a := startAgent(t, bin, args)
	c := nodeapi.NewClient(addr, "pool-secret", nil)
	framework.Eventually(t, time.Minute, "the pre-pull to be part way", func(ctx context.Context) (bool, error) {
		all, err := c.ImageStatuses(ctx)
		if err != nil {
			return false, nil
		}
		st := statusOf(all, ref)
		if st.State == runtime.ImageReady {
			return false, errors.New("the pre-pull finished before the kill: slow the proxy down")
		}
		return st.State == runtime.ImagePulling && st.BytesDone > 1<<20, nil
	})
	if err := a.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-a.done

	// What the killed agent left is not ready to anyone.
	m := newImageManager(t, cc, ns)
	if slices.Contains(m.Ready(), ref) {
		t.Fatalf("%s reported ready after a pull cut short", ref)
	}
	ctx := namespaces.WithNamespace(t.Context(), ns)
	if got, err := cc.GetImage(ctx, ref); err == nil {
		if ok, _ := got.IsUnpacked(ctx, "overlayfs"); ok {
			t.Fatalf("%s unpacked after a pull cut short", ref)
		}
	}

	// The agent comes back and its pre-pull completes the image.
	proxy.bytesPerSecond.Store(0)
	startAgent(t, bin, args)
	framework.Eventually(t, 2*time.Minute, "the restarted agent to finish the pre-pull", func(ctx context.Context) (bool, error) {
		all, err := c.ImageStatuses(ctx)
		if err != nil {
			return false, nil
		}
		st := statusOf(all, ref)
		if st.State == runtime.ImageFailed {
			return false, errors.New(st.Error)
		}
		return st.State == runtime.ImageReady, nil
	})
	got, err := cc.GetImage(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := got.IsUnpacked(ctx, "overlayfs"); err != nil || !ok {
		t.Fatalf("not unpacked after the restart: %v", err)
	}
	t.Logf("blob downloads in all: %d for %d blobs", proxy.BlobGets(), img.Blobs)
}

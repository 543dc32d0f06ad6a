//go:build root

package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
	"github.com/prometheus/client_golang/prometheus"
	krand "k8s.io/apimachinery/pkg/util/rand"

	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/lazyimage"
	"github.com/sandman-dev/sandman/nodeimage"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// TestRootLazyPull: a node runtime on the stack's stargz-snapshotter
// (--snapshotter stargz --lazy-pull) starts a sandbox of an eStargz image
// (lazyimage, as sandmanctl images convert makes it) without containerd
// fetching its big layer: the sandbox answers, reads the layer's files
// byte-identical to what was pushed, and a second sandbox of the image on the
// node fetches nothing either. An image that is not eStargz still runs
// (pulled whole). Deleting the image unmounts its lazy layers.
func TestRootLazyPull(t *testing.T) {
	s := framework.Get(t)
	ctx := t.Context()

	src, res, sums, bigest := pushLazyImage(t, s, s.Registry+"/lazy-test/"+krand.String(8))
	image := res.Target.String()

	rt := newContainerdRuntime(t, s, 6, 1, func(c *noderuntime.Config) {
		c.Snapshotter, c.LazyPull, c.LazyMetricsURL = "stargz", true, s.Env["STARGZ_METRICS_URL"]
	})
	cc := s.Containerd(t, runtimeNamespace)
	nsctx := namespaces.WithNamespace(ctx, runtimeNamespace)
	before := metricValues(t, rt)
	start := time.Now()
	first := bindAndWait(t, rt, "lazy-1", image)
	t.Logf("eStargz image of %d MiB: first sandbox answering %v after its bind", res.Bytes>>20, time.Since(start).Round(time.Millisecond))
	if out, err := sandboxExec(ctx, first, runtimetest.Token, "cat", "/app/hello.txt"); err != nil || out != "hello lazy\n" {
		t.Fatalf("cat /app/hello.txt: %q, %v", out, err)
	}
	// containerd never fetched the big layer: the snapshotter mounted it.
	if _, err := cc.ContentStore().Info(nsctx, digest.Digest(bigest.Digest.String())); !errdefs.IsNotFound(err) {
		t.Fatalf("the %d MiB layer %s is in containerd's content store (%v): it was pulled, not mounted lazily", bigest.Size>>20, bigest.Digest, err)
	}
	for n, want := range sums {
		out, err := sandboxExec(ctx, first, runtimetest.Token, "sha256sum", "/"+n)
		if err != nil {
			t.Fatal(err)
		}
		if got, _, _ := strings.Cut(out, " "); got != want {
			t.Errorf("/%s reads %s in the sandbox, %s was pushed", n, got, want)
		}
	}
	// The node's metrics tell what was fetched lazily and eagerly.
	after := metricValues(t, rt)
	if after["sandman_node_image_lazy_up"] != 1 {
		t.Errorf("sandman_node_image_lazy_up = %v: the snapshotter's metrics did not answer", after["sandman_node_image_lazy_up"])
	}
	if d := after["sandman_node_image_lazy_fetched_bytes"] - before["sandman_node_image_lazy_fetched_bytes"]; d < float64(bigest.Size)*0.9 {
		t.Errorf("sandman_node_image_lazy_fetched_bytes grew by %.0f reading the %d-byte layer's files whole", d, bigest.Size)
	}
	if after["sandman_node_image_lazy_fetch_duration_seconds"] <= before["sandman_node_image_lazy_fetch_duration_seconds"] {
		t.Errorf("no lazy fetch was timed (sandman_node_image_lazy_fetch_duration_seconds count %v)", after["sandman_node_image_lazy_fetch_duration_seconds"])
	}
	if d := after["sandman_node_image_pulled_bytes_total"] - before["sandman_node_image_pulled_bytes_total"]; d >= float64(bigest.Size) {
		t.Errorf("sandman_node_image_pulled_bytes_total grew by %.0f: the lazily mounted %d-byte layer counted as fetched eagerly", d, bigest.Size)
	}
	second := bindAndWait(t, rt, "lazy-2", image)
	if out, err := sandboxExec(ctx, second, runtimetest.Token, "sha256sum", "/data/blob0"); err != nil || !strings.HasPrefix(out, sums["data/blob0"]) {
		t.Errorf("second sandbox: sha256sum /data/blob0: %q, %v", out, err)
	}
	if _, err := cc.ContentStore().Info(nsctx, digest.Digest(bigest.Digest.String())); !errdefs.IsNotFound(err) {
		t.Errorf("after the second bind the big layer is in the content store (%v)", err)
	}
	// An ordinary image on the same snapshotter is pulled and runs.
	plain := bindAndWait(t, rt, "lazy-plain", src.String())
	if out, err := sandboxExec(ctx, plain, runtimetest.Token, "cat", "/app/hello.txt"); err != nil || out != "hello lazy\n" {
		t.Errorf("the image before conversion: cat /app/hello.txt: %q, %v", out, err)
	}
	if _, err := cc.ContentStore().Info(nsctx, digest.Digest(biggestLayer(t, mustImage(t, src)).Digest.String())); err != nil {
		t.Errorf("the image before conversion was not pulled whole: %v", err)
	}

	for _, uid := range []string{"lazy-1", "lazy-2", "lazy-plain"} {
		if err := rt.Release(ctx, uid, 0); err != nil {
			t.Fatal(err)
		}
	}
	// Once the images go, so do the snapshotter's mounts of them.
	deleteImagesUnmounted(t, cc, true, image, src.String())
}

// pushLazyImage pushes pushPlainImage's image as repo:v1 and its eStargz
// conversion as repo:v1-esgz; it returns both, the files' SHA-256, and the
// conversion's biggest layer.
func pushLazyImage(t *testing.T, s *framework.Stack, repo string, opts ...remote.Option) (name.Reference, lazyimage.Result, map[string]string, v1.Descriptor) {
	t.Helper()
	src, sums := pushPlainImage(t, s, repo+":v1", opts...)
	res, err := lazyimage.Convert(t.Context(), src, mustRef(t, repo+":v1-esgz"), lazyimage.Options{Prioritized: []string{"app/hello.txt"}, TempDir: t.TempDir(), Remote: opts})
	if err != nil {
		t.Fatal(err)
	}
	return src, res, sums, biggestLayer(t, mustImage(t, res.Target, opts...))
}

// pushPlainImage pushes busybox, then 32 MiB of random files in one layer
// (data/blob0..3), then /app/hello.txt, as ref; it returns ref and the
// files' SHA-256.
func pushPlainImage(t *testing.T, s *framework.Stack, ref string, opts ...remote.Option) (name.Reference, map[string]string) {
	t.Helper()
	return pushImageOf(t, s, ref, 4, 8<<20, opts...)
}

// pushImageOf is pushPlainImage with n random files of size bytes.
func pushImageOf(t *testing.T, s *framework.Stack, ref string, n, size int, opts ...remote.Option) (name.Reference, map[string]string) {
	t.Helper()
	base := mustImage(t, mustRef(t, s.BusyboxImage))
	files := map[string][]byte{}
	sums := map[string]string{}
	for i := range n {
		b := make([]byte, size)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		n := fmt.Sprintf("data/blob%d", i)
		files[n] = b
		h := sha256.Sum256(b)
		sums[n] = hex.EncodeToString(h[:])
	}
	img, err := mutate.AppendLayers(base, tarLayerOf(t, files), tarLayerOf(t, map[string][]byte{"app/hello.txt": []byte("hello lazy\n")}))
	if err != nil {
		t.Fatal(err)
	}
	src := mustRef(t, ref)
	if err := remote.Write(src, img, append([]remote.Option{remote.WithContext(t.Context())}, opts...)...); err != nil {
		t.Fatal(err)
	}
	return src, sums
}

// TestRootLazyConvert: a lazy node with a convert repository
// (--lazy-convert-repository) pulls an ordinary public image whole the
// first time, converts it from what it fetched and pushes the conversion to
// the pool's repository; once the image is gone from the node, its next
// bind mounts the conversion lazily (containerd fetches neither big layer),
// and the sandbox reads the same bytes. Deleting the image unmounts it.
func TestRootLazyConvert(t *testing.T) {
	s := framework.Get(t)
	ctx := t.Context()
	src, sums := pushPlainImage(t, s, s.Registry+"/lazy-conv/"+krand.String(8)+":v1")
	pool := s.Registry + "/lazy-pool-" + krand.String(6)
	rt := newContainerdRuntime(t, s, 6, 1, func(c *noderuntime.Config) {
		c.Snapshotter, c.LazyPull, c.LazyConvertRepository = "stargz", true, pool
	})
	cc := s.Containerd(t, runtimeNamespace)
	nsctx := namespaces.WithNamespace(ctx, runtimeNamespace)
	inStore := func(d v1.Hash) bool {
		_, err := cc.ContentStore().Info(nsctx, digest.Digest(d.String()))
		return err == nil
	}
	srcBig := biggestLayer(t, mustImage(t, src))

	first := bindAndWait(t, rt, "conv-1", src.String())
	if out, err := sandboxExec(ctx, first, runtimetest.Token, "cat", "/app/hello.txt"); err != nil || out != "hello lazy\n" {
		t.Fatalf("cat /app/hello.txt: %q, %v", out, err)
	}
	if !inStore(srcBig.Digest) {
		t.Fatalf("first pull: the big layer %s is not in the content store: with no conversion yet the image is pulled whole", srcBig.Digest)
	}
	// The node converts it in the background and pushes it to the pool.
	conv := waitConversion(t, pool, src)
	convImg := mustImage(t, conv)
	cm, err := convImg.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if !lazyimage.IsLazy(cm) {
		t.Fatalf("the pushed conversion is not eStargz: %+v", cm.Layers)
	}
	convBig := biggestLayer(t, convImg)

	// Gone from the node, the image comes back from the conversion, lazily.
	if err := rt.Release(ctx, "conv-1", 0); err != nil {
		t.Fatal(err)
	}
	deleteImagesUnmounted(t, cc, false, src.String())
	framework.Eventually(t, time.Minute, "the first pull's big layer collected", func(context.Context) (bool, error) {
		return !inStore(srcBig.Digest), nil
	})
	second := bindAndWait(t, rt, "conv-2", src.String())
	if inStore(convBig.Digest) || inStore(srcBig.Digest) {
		t.Errorf("second pull: a big layer is in the content store (source %v, conversion %v): it was pulled, not mounted lazily", inStore(srcBig.Digest), inStore(convBig.Digest))
	}
	rec, err := cc.ImageService().Get(nsctx, src.String())
	if err != nil {
		t.Fatal(err)
	}
	if got := rec.Labels[nodeimage.LabelLazyFrom]; got != conv.String() {
		t.Errorf("image %s: label %s = %q, want %q", src, nodeimage.LabelLazyFrom, got, conv)
	}
	for n, want := range sums {
		out, err := sandboxExec(ctx, second, runtimetest.Token, "sha256sum", "/"+n)
		if err != nil {
			t.Fatal(err)
		}
		if got, _, _ := strings.Cut(out, " "); got != want {
			t.Errorf("/%s reads %s from the conversion, %s was pushed", n, got, want)
		}
	}
	if err := rt.Release(ctx, "conv-2", 0); err != nil {
		t.Fatal(err)
	}
	deleteImagesUnmounted(t, cc, true, src.String())
}

// metricValues reads rt's metrics and its images': each family's sum over its series (a
// histogram's: its sample count).
func metricValues(t *testing.T, rt *noderuntime.Runtime) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(rt.Collector(), rt.Images().Collector())
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			switch {
			case m.Gauge != nil:
				out[f.GetName()] += m.GetGauge().GetValue()
			case m.Counter != nil:
				out[f.GetName()] += m.GetCounter().GetValue()
			case m.Histogram != nil:
				out[f.GetName()] += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

// conversionOf names src's conversion in the pool's convert repository, as
// the node agent does.
func conversionOf(t *testing.T, pool string, src name.Reference, opts ...remote.Option) name.Reference {
	t.Helper()
	head, err := remote.Head(src, append([]remote.Option{remote.WithContext(t.Context())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return mustRef(t, pool+"/"+strings.ReplaceAll(src.Context().RegistryStr(), ":", "-")+"/"+src.Context().RepositoryStr()+":"+head.Digest.Algorithm+"-"+head.Digest.Hex+"-esgz")
}

// waitConversion waits until src's conversion is in the pool's registry.
func waitConversion(t *testing.T, pool string, src name.Reference) name.Reference {
	t.Helper()
	conv := conversionOf(t, pool, src)
	framework.Eventually(t, 2*time.Minute, "the conversion "+conv.String()+" in the pool's registry", func(ctx context.Context) (bool, error) {
		_, err := remote.Head(conv, remote.WithContext(ctx))
		return err == nil, nil
	})
	return conv
}

// deleteImagesUnmounted deletes refs from the runtime namespace, then, with
// wait, waits until the stack's stargz-snapshotter mounts nothing.
func deleteImagesUnmounted(t *testing.T, cc *containerd.Client, wait bool, refs ...string) {
	t.Helper()
	for _, ref := range refs {
		framework.Eventually(t, time.Minute, "deleting "+ref, func(ctx context.Context) (bool, error) {
			err := cc.ImageService().Delete(namespaces.WithNamespace(ctx, runtimeNamespace), ref, images.SynchronousDelete())
			return err == nil || errdefs.IsNotFound(err), nil
		})
	}
	if wait {
		root := filepath.Join(framework.StateDir(), "stargz") + "/"
		framework.Eventually(t, time.Minute, "the lazy layers unmounted", func(context.Context) (bool, error) {
			mi, _ := os.ReadFile("/proc/self/mountinfo")
			return !strings.Contains(string(mi), root), nil
		})
	}
}

func mustImage(t *testing.T, ref name.Reference, opts ...remote.Option) v1.Image {
	t.Helper()
	img, err := remote.Image(ref, append([]remote.Option{remote.WithContext(t.Context())}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// TestRootLazyPullPrivate: a private eStargz image on a lazy node is served
// only to pods whose pull secret its registry accepts — the node's access
// check runs before the snapshotter is asked — and, since the snapshotter
// has no pod's credentials, it is pulled whole with the pod's, not mounted
// lazily: the pod reads the same files.
func TestRootLazyPullPrivate(t *testing.T) {
	s := framework.Get(t)
	ctx := t.Context()
	authHost := startAuthRegistry(t, s, "trainer", "s3cret")
	auth := remote.WithAuth(&authn.Basic{Username: "trainer", Password: "s3cret"})
	src, res, sums, bigest := pushLazyImage(t, s, authHost+"/private/lazy-"+krand.String(8), auth)
	image := res.Target.String()
	pool := s.Registry + "/lazy-pool-" + krand.String(6)
	rt := newContainerdRuntime(t, s, 6, 1, func(c *noderuntime.Config) {
		c.Snapshotter, c.LazyPull, c.LazyConvertRepository = "stargz", true, pool
	})
	for who, secrets := range map[string][][]byte{
		"lazy-priv-none":  nil,
		"lazy-priv-wrong": {dockerConfig(authHost, "trainer", "wrong")},
	} {
		req := runtimetest.Request(who, image, "sleep", "100000")
		req.PullSecrets = secrets
		if _, err := rt.Bind(ctx, req); !errors.Is(err, runtime.ErrImagePull) || !errdefs.IsUnauthorized(err) {
			t.Fatalf("%s: %v, want ErrImagePull unauthorized", who, err)
		}
	}
	req := runtimetest.Request("lazy-priv-ok", image, "sleep", "100000")
	req.PullSecrets = [][]byte{dockerConfig(authHost, "trainer", "s3cret")}
	slot, err := rt.Bind(ctx, req)
	if err != nil {
		t.Fatalf("with the secret: %v", err)
	}
	framework.Eventually(t, time.Minute, "the private sandbox's daemon", func(ctx context.Context) (bool, error) {
		_, err := sandboxExec(ctx, slot, runtimetest.Token, "true")
		return err == nil, nil
	})
	for n, want := range sums {
		out, err := sandboxExec(ctx, slot, runtimetest.Token, "sha256sum", "/"+n)
		if err != nil {
			t.Fatal(err)
		}
		if got, _, _ := strings.Cut(out, " "); got != want {
			t.Errorf("/%s reads %s, %s was pushed", n, got, want)
		}
	}
	cc := s.Containerd(t, runtimeNamespace)
	nsctx := namespaces.WithNamespace(ctx, runtimeNamespace)
	if _, err := cc.ContentStore().Info(nsctx, digest.Digest(bigest.Digest.String())); err != nil {
		t.Errorf("the private image's big layer is not in the content store (%v): the snapshotter mounted it with credentials it should not have", err)
	}
	// A private image is never converted into the pool's registry, where
	// anyone could pull it: the public image pulled after it is (the node
	// converts one image at a time, in order).
	privSrc, _ := pushPlainImage(t, s, authHost+"/private/plain-"+krand.String(8)+":v1", auth)
	req = runtimetest.Request("lazy-priv-plain", privSrc.String(), "sleep", "100000")
	req.PullSecrets = [][]byte{dockerConfig(authHost, "trainer", "s3cret")}
	if _, err := rt.Bind(ctx, req); err != nil {
		t.Fatalf("private plain image: %v", err)
	}
	pub, _ := pushPlainImage(t, s, s.Registry+"/lazy-conv/"+krand.String(8)+":v1")
	bindAndWait(t, rt, "lazy-pub-plain", pub.String())
	waitConversion(t, pool, pub)
	if _, err := remote.Head(conversionOf(t, pool, privSrc, auth), remote.WithContext(ctx)); err == nil {
		t.Errorf("the private image %s was converted into the pool's registry %s", privSrc, pool)
	}
	for _, uid := range []string{"lazy-priv-ok", "lazy-priv-plain", "lazy-pub-plain"} {
		if err := rt.Release(ctx, uid, 0); err != nil {
			t.Fatal(err)
		}
	}
	for _, ref := range []string{image, src.String(), privSrc.String(), pub.String()} {
		if err := cc.ImageService().Delete(nsctx, ref, images.SynchronousDelete()); err != nil && !errdefs.IsNotFound(err) {
			t.Errorf("delete %s: %v", ref, err)
		}
	}
}

func mustRef(t *testing.T, s string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(s)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// biggestLayer is the descriptor of img's largest layer.
func biggestLayer(t *testing.T, img v1.Image) v1.Descriptor {
	t.Helper()
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	var big v1.Descriptor
	for _, l := range m.Layers {
		if l.Size > big.Size {
			big = l
		}
	}
	return big
}

func tarLayerOf(t *testing.T, files map[string][]byte) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for n, b := range files {
		if d := filepath.Dir(n); !dirs[d] {
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
				t.Fatal(err)
			}
		}
		if err := tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(b))}); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(b); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	data := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// bindAndWait binds uid to a sandbox of image that sleeps, and waits until
// its daemon answers.
func bindAndWait(t *testing.T, rt *noderuntime.Runtime, uid, image string) runtime.Slot {
	t.Helper()
	slot, err := rt.Bind(t.Context(), runtimetest.Request(uid, image, "sleep", "100000"))
	if err != nil {
		t.Fatalf("bind %s of %s: %v", uid, image, err)
	}
	framework.Eventually(t, time.Minute, uid+"'s daemon", func(ctx context.Context) (bool, error) {
		_, err := sandboxExec(ctx, slot, runtimetest.Token, "true")
		return err == nil, nil
	})
	return slot
}

// TestRootLazySnapshotterRestart: the lazy-pulling snapshotter killed under
// running sandboxes. A sandbox of an ordinary image keeps answering all
// along. A lazily pulled one cannot read its image's unfetched files any
// more (its FUSE mounts died with the snapshotter): the node stops it with an
// Evicted exit that says so, instead of leaving it failing reads. Once the
// snapshotter is back, a new sandbox of the same image starts and reads it
// byte-identical.
func TestRootLazySnapshotterRestart(t *testing.T) {
	s := framework.Get(t)
	ctx := t.Context()
	_, res, sums, _ := pushLazyImage(t, s, s.Registry+"/lazy-restart/"+krand.String(8))
	image := res.Target.String()
	rt := newContainerdRuntime(t, s, 6, 1, func(c *noderuntime.Config) {
		c.Snapshotter, c.LazyPull = "stargz", true
		c.DiskCheckInterval = 500 * time.Millisecond
	})
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	_, events, err := rt.Watch(wctx)
	if err != nil {
		t.Fatal(err)
	}
	lazy := bindAndWait(t, rt, "restart-lazy", image)
	plain := bindAndWait(t, rt, "restart-plain", s.BusyboxImage)
	if out, err := sandboxExec(ctx, lazy, runtimetest.Token, "cat", "/app/hello.txt"); err != nil || out != "hello lazy\n" {
		t.Fatalf("cat /app/hello.txt: %q, %v", out, err)
	}
	stargz := s.Component(t, "stargz")
	stargz.Kill(t)
	t.Cleanup(func() { startStargz(t, stargz) })

	waitExit(t, events, lazy.ID, func(ev runtime.Event) {
		if ev.Reason != runtime.ReasonEvicted || !strings.Contains(ev.Message, "lazy-pulling snapshotter") {
			t.Fatalf("lazy sandbox's exit %+v: want Evicted naming the lazy-pulling snapshotter", ev)
		}
		t.Logf("lazy sandbox stopped: %s", ev.Message)
	})
	if out, err := sandboxExec(ctx, plain, runtimetest.Token, "echo", "ok"); err != nil || out != "ok\n" {
		t.Errorf("the ordinary sandbox with the snapshotter down: %q, %v", out, err)
	}
	if err := rt.Release(ctx, "restart-lazy", 0); err != nil {
		t.Fatal(err)
	}

	startStargz(t, stargz)
	again := bindAndWait(t, rt, "restart-again", image)
	for n, want := range sums {
		out, err := sandboxExec(ctx, again, runtimetest.Token, "sha256sum", "/"+n)
		if err != nil {
			t.Fatal(err)
		}
		if got, _, _ := strings.Cut(out, " "); got != want {
			t.Errorf("after the restart /%s reads %s, %s was pushed", n, got, want)
		}
	}
	if out, err := sandboxExec(ctx, plain, runtimetest.Token, "echo", "ok"); err != nil || out != "ok\n" {
		t.Errorf("the ordinary sandbox after the restart: %q, %v", out, err)
	}
	for _, uid := range []string{"restart-again", "restart-plain"} {
		if err := rt.Release(ctx, uid, 0); err != nil {
			t.Fatal(err)
		}
	}
	deleteImagesUnmounted(t, s.Containerd(t, runtimeNamespace), true, image)
}

// startStargz starts the stack's stargz-snapshotter again, if it is not
// running, and waits until containerd reaches it through its proxy plugin.
func startStargz(t *testing.T, c *framework.Component) {
	t.Helper()
	if !c.Running() {
		c.Start(t)
	}
	cc := framework.Get(t).Containerd(t, runtimeNamespace)
	framework.Eventually(t, time.Minute, "stargz-snapshotter to answer", func(ctx context.Context) (bool, error) {
		// A Stat of an unknown key is answered by containerd alone.
		ctx = namespaces.WithNamespace(ctx, runtimeNamespace)
		snaps := cc.SnapshotService("stargz")
		if _, err := snaps.Prepare(ctx, "sandman-test-probe", ""); err != nil {
			return false, nil
		}
		return true, snaps.Remove(ctx, "sandman-test-probe")
	})
}

// TestRootLazyRegistryGone: the registry of a lazily pulled image goes away
// under a running sandbox. What the sandbox read already (and what the image
// prioritized, fetched when it was mounted) reads on; a file not fetched yet
// fails with EIO once the snapshotter's retries are spent, rather than
// hanging; the other sandboxes and the node's binds carry on.
func TestRootLazyRegistryGone(t *testing.T) {
	s := framework.Get(t)
	ctx := t.Context()
	reg := startTestRegistry(t, s, "", "")
	_, res, sums, _ := pushLazyImage(t, s, reg.Host+"/lazy-gone/"+krand.String(8))
	rt := newContainerdRuntime(t, s, 6, 1, func(c *noderuntime.Config) {
		c.Snapshotter, c.LazyPull = "stargz", true
	})
	plain := bindAndWait(t, rt, "gone-plain", s.BusyboxImage)
	lazy := bindAndWait(t, rt, "gone-lazy", res.Target.String())
	// The shell the checks below run, read whole while the registry is up.
	if _, err := sandboxExec(ctx, lazy, runtimetest.Token, "sh", "-c", "cat /bin/busybox >/dev/null"); err != nil {
		t.Fatal(err)
	}
	reg.Stop()

	if out, err := sandboxExec(ctx, lazy, runtimetest.Token, "cat", "/app/hello.txt"); err != nil || out != "hello lazy\n" {
		t.Errorf("a prioritized file with the registry gone: %q, %v", out, err)
	}
	start := time.Now()
	xctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	out, err := sandboxExec(xctx, lazy, runtimetest.Token, "sh", "-c", "sha256sum /data/blob3 2>&1; echo rc=$?")
	if err != nil {
		t.Fatalf("reading an unfetched file with the registry gone: %v (after %v)", err, time.Since(start))
	}
	if !strings.Contains(out, "I/O error") && !strings.Contains(out, "Input/output error") || strings.Contains(out, "rc=0") || strings.Contains(out, sums["data/blob3"]) {
		t.Errorf("reading an unfetched file with the registry gone: %q, want an I/O error", out)
	}
	t.Logf("an unfetched file with the registry gone: %q after %v", strings.TrimSpace(out), time.Since(start).Round(time.Millisecond))

	if out, err := sandboxExec(ctx, plain, runtimetest.Token, "echo", "ok"); err != nil || out != "ok\n" {
		t.Errorf("the other sandbox: %q, %v", out, err)
	}
	bindAndWait(t, rt, "gone-other", s.BusyboxImage)
	for _, uid := range []string{"gone-lazy", "gone-plain", "gone-other"} {
		if err := rt.Release(ctx, uid, 0); err != nil {
			t.Fatal(err)
		}
	}
	deleteImagesUnmounted(t, s.Containerd(t, runtimeNamespace), true, res.Target.String())
}

// TestRootLazyCorrupt: lazily pulled layers that are not what they say.
// A layer whose table of contents does not match the digest its manifest
// gives is refused by the snapshotter and pulled whole (verified against
// its digest by containerd): the sandbox reads the right bytes. A layer
// whose bytes were damaged in the registry after it was pushed is mounted
// (its table of contents is intact) but a file in the damaged part fails
// to read with EIO: never wrong bytes.
func TestRootLazyCorrupt(t *testing.T) {
	s := framework.Get(t)
	ctx := t.Context()
	reg := startTestRegistry(t, s, "", "")
	rt := newContainerdRuntime(t, s, 6, 1, func(c *noderuntime.Config) {
		c.Snapshotter, c.LazyPull = "stargz", true
	})
	cc := s.Containerd(t, runtimeNamespace)
	nsctx := namespaces.WithNamespace(ctx, runtimeNamespace)

	// A wrong TOC digest: refused, pulled whole.
	_, res, sums, big := pushLazyImage(t, s, reg.Host+"/lazy-badtoc/"+krand.String(8))
	desc, err := remote.Get(res.Target, remote.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	var m v1.Manifest
	if err := json.Unmarshal(desc.Manifest, &m); err != nil {
		t.Fatal(err)
	}
	for i := range m.Layers {
		if m.Layers[i].Digest == big.Digest {
			m.Layers[i].Annotations[lazyimage.TOCDigestAnnotation] = digest.FromString("not the TOC").String()
		}
	}
	raw, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	badTOC := res.Target.Context().Tag("badtoc")
	if err := remote.Put(badTOC, rawManifest(raw), remote.WithContext(ctx)); err != nil {
		t.Fatal(err)
	}
	badRef := badTOC.Context().Digest(digest.FromBytes(raw).String()).String()
	sl := bindAndWait(t, rt, "corrupt-toc", badRef)
	if _, err := cc.ContentStore().Info(nsctx, digest.Digest(big.Digest.String())); err != nil {
		t.Errorf("a layer with a wrong TOC digest was not pulled whole (%v): the snapshotter mounted what it could not verify", err)
	}
	for n, want := range sums {
		out, err := sandboxExec(ctx, sl, runtimetest.Token, "sha256sum", "/"+n)
		if err != nil {
			t.Fatal(err)
		}
		if got, _, _ := strings.Cut(out, " "); got != want {
			t.Errorf("wrong TOC digest: /%s reads %s, %s was pushed", n, got, want)
		}
	}

	// Damaged bytes in the registry: EIO for the damaged file, never
	// other bytes.
	_, res2, sums2, big2 := pushLazyImage(t, s, reg.Host+"/lazy-damaged/"+krand.String(8))
	blob := filepath.Join(reg.Dir, "data/docker/registry/v2/blobs", big2.Digest.Algorithm, big2.Digest.Hex[:2], big2.Digest.Hex, "data")
	f, err := os.OpenFile(blob, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	junk := make([]byte, 256<<10)
	if _, err := rand.Read(junk); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(junk, big2.Size/3); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	dmg := bindAndWait(t, rt, "corrupt-damaged", res2.Target.String())
	failed := 0
	for n, want := range sums2 {
		out, err := sandboxExec(ctx, dmg, runtimetest.Token, "sh", "-c", "sha256sum /"+n+" 2>&1; echo rc=$?")
		if err != nil {
			t.Fatal(err)
		}
		switch got, _, _ := strings.Cut(out, " "); {
		case got == want:
		case strings.Contains(out, "Input/output error") && !strings.Contains(out, "rc=0"):
			failed++
		default:
			t.Errorf("damaged layer: /%s: %q, want its pushed sum %s or an I/O error", n, out, want)
		}
	}
	if failed == 0 {
		t.Errorf("damaged layer: every file read back whole: the damage at offset %d was not read", big2.Size/3)
	}
	t.Logf("damaged layer: %d of %d files failed with EIO, the others read their pushed bytes", failed, len(sums2))
	for _, uid := range []string{"corrupt-toc", "corrupt-damaged"} {
		if err := rt.Release(ctx, uid, 0); err != nil {
			t.Fatal(err)
		}
	}
	deleteImagesUnmounted(t, cc, true, badRef, res2.Target.String())
}

// rawManifest is a manifest to remote.Put as it is.
type rawManifest []byte

func (r rawManifest) RawManifest() ([]byte, error) { return r, nil }

func (r rawManifest) MediaType() (types.MediaType, error) { return types.OCIManifestSchema1, nil }

// TestRootLazyWorkingSet: a worker serves more distinct lazily pulled images
// than its disk budget holds whole. 30 images of 8 MiB, a budget of 10 of
// them; each sandbox reads a quarter of its image. Every bind succeeds; the
// lazy cache counts against the budget, so the image GC removes cold images
// (their cached reads go with them) and the disk stays within the budget,
// with more images on the node than the budget would hold pulled whole.
func TestRootLazyWorkingSet(t *testing.T) {
	s := framework.Get(t)
	ctx := t.Context()
	const (
		images    = 30
		files     = 8
		fileBytes = 1 << 20
		budget    = 10 * files * fileBytes
	)
	refs := make([]string, images)
	sums := make([]map[string]string, images)
	repo := s.Registry + "/lazy-ws-" + krand.String(6)
	for i := range images {
		src, sum := pushImageOf(t, s, fmt.Sprintf("%s/img%d:v1", repo, i), files, fileBytes)
		res, err := lazyimage.Convert(ctx, src, mustRef(t, fmt.Sprintf("%s/img%d:v1-esgz", repo, i)), lazyimage.Options{TempDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		refs[i], sums[i] = res.Target.String(), sum
	}
	cacheDir := s.Env["STARGZ_CACHE_DIR"]
	rt := newContainerdRuntime(t, s, 6, 1, func(c *noderuntime.Config) {
		c.Snapshotter, c.LazyPull = "stargz", true
		c.LazyMetricsURL, c.LazyCacheDir = s.Env["STARGZ_METRICS_URL"], cacheDir
		c.ImageCacheBytes = budget
	})
	for i, ref := range refs {
		uid := fmt.Sprintf("ws-%d", i)
		sl := bindAndWait(t, rt, uid, ref)
		for _, n := range []string{"data/blob0", "data/blob1"} {
			out, err := sandboxExec(ctx, sl, runtimetest.Token, "sha256sum", "/"+n)
			if err != nil {
				t.Fatal(err)
			}
			if got, _, _ := strings.Cut(out, " "); got != sums[i][n] {
				t.Fatalf("image %d: /%s reads %s, %s was pushed", i, n, got, sums[i][n])
			}
		}
		if err := rt.Release(ctx, uid, 0); err != nil {
			t.Fatal(err)
		}
	}
	// Within the budget, once the snapshotter dropped the cache of the
	// layers the GC removed (it does 10 s after their last mount).
	var u nodeimage.Usage
	framework.Eventually(t, time.Minute, "the image cache and the lazy cache within the budget", func(ctx context.Context) (bool, error) {
		if _, err := rt.Images().GC(ctx); err != nil {
			return false, err
		}
		u = rt.Images().Usage(ctx)
		return u.Bytes <= budget && dirBytes(t, cacheDir) <= budget, nil
	})
	t.Logf("after %d images on a budget of %d MiB: %d images (%d lazy) on the node, %d MiB used of which %d MiB lazy cache; lazy cache on disk %d MiB",
		images, budget>>20, u.Images, u.LazyImages, u.Bytes>>20, u.LazyBytes>>20, dirBytes(t, cacheDir)>>20)
	if u.LazyBytes == 0 {
		t.Errorf("the lazy cache measured 0 bytes after 30 sandboxes read %d MiB each", 2*fileBytes>>20)
	}
	if u.Images >= images {
		t.Errorf("%d images on the node: the GC removed none while the reads outgrew the budget", u.Images)
	}
	if u.LazyImages <= 10 {
		t.Errorf("%d lazy images on the node: no more than the budget holds pulled whole", u.LazyImages)
	}
	if got := metricValues(t, rt)["sandman_node_image_lazy_cache_bytes"]; got != float64(u.LazyBytes) {
		t.Errorf("sandman_node_image_lazy_cache_bytes = %v, usage says %d", got, u.LazyBytes)
	}
	deleteImagesUnmounted(t, s.Containerd(t, runtimeNamespace), true, refs...)
}

// dirBytes is the disk the files under dir use.
func dirBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err != nil {
			return nil // a cache dropped while we walk
		}
		if info, err := d.Info(); err == nil && info.Mode().IsRegular() {
			n += info.Sys().(*syscall.Stat_t).Blocks * 512
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestRootLazyPytest: a task image as SWE sets ship them — Debian with
// Python and pytest, 64 MiB of incompressible data, a Python project —
// converted to eStargz with the project prioritized. On a cold lazy node its
// first sandbox is ready and passes the project's pytest before the image
// is fetched (most of its bytes never are); a second sandbox of it on the
// node runs pytest fetching nothing; its files are byte-identical to a full
// pull of the same image, with the same modes and modification times.
func TestRootLazyPytest(t *testing.T) {
	s := framework.Get(t)
	ctx := t.Context()
	base := mustImage(t, mustRef(t, s.DebianImage))
	files := map[string][]byte{}
	for i := range 8 {
		b := make([]byte, 8<<20)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		files[fmt.Sprintf("data/blob%d", i)] = b
	}
	project := map[string][]byte{
		"app/calc.py":      []byte("def add(a, b):\n    return a + b\n"),
		"app/test_calc.py": []byte("from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"),
	}
	img, err := mutate.AppendLayers(base, tarLayerOf(t, files), tarLayerOf(t, project))
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	repo := s.Registry + "/lazy-pytest/" + krand.String(8)
	src := mustRef(t, repo+":v1")
	if err := remote.Write(src, img, remote.WithContext(ctx)); err != nil {
		t.Fatal(err)
	}
	res, err := lazyimage.Convert(ctx, src, mustRef(t, repo+":v1-esgz"), lazyimage.Options{
		Prioritized: []string{"app/calc.py", "app/test_calc.py"}, TempDir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("image pushed and converted in %v", time.Since(began).Round(time.Millisecond))
	rt := newContainerdRuntime(t, s, 6, 1, func(c *noderuntime.Config) {
		c.Snapshotter, c.LazyPull, c.LazyMetricsURL = "stargz", true, s.Env["STARGZ_METRICS_URL"]
	})
	pytest := func(sl runtime.Slot) {
		t.Helper()
		out, err := sandboxExec(ctx, sl, runtimetest.Token, "sh", "-c", "cd /app && python3 -m pytest -q -p no:cacheprovider 2>&1")
		if err != nil || !strings.Contains(out, "1 passed") {
			t.Fatalf("pytest: %q, %v", out, err)
		}
	}
	fetched := func() float64 { return metricValues(t, rt)["sandman_node_image_lazy_fetched_bytes"] }

	before := fetched()
	start := time.Now()
	first := bindAndWait(t, rt, "pytest-1", res.Target.String())
	pytest(first)
	took, got := time.Since(start), fetched()-before
	t.Logf("cold lazy bind → pytest passed in %v, %.1f MiB fetched of the image's %d MiB", took.Round(time.Millisecond), got/(1<<20), res.Bytes>>20)
	if got <= 0 || got >= float64(res.Bytes)/2 {
		t.Errorf("the first pytest fetched %.0f bytes of the image's %d: want some, and well under the whole", got, res.Bytes)
	}

	before = fetched()
	second := bindAndWait(t, rt, "pytest-2", res.Target.String())
	pytest(second)
	if d := fetched() - before; d != 0 {
		t.Errorf("the second sandbox of the image on the node fetched %.0f bytes: want none", d)
	}

	// The same files as a full pull of the plain image (in sandboxes that
	// ran nothing: pytest writes bytecode beside the sources).
	began = time.Now()
	full := bindAndWait(t, rt, "pytest-full", src.String())
	t.Logf("full pull and bind of the plain image: %v", time.Since(began).Round(time.Millisecond))
	tree := bindAndWait(t, rt, "pytest-tree", res.Target.String())
	// Modes and modification times too: the test layers' files have the
	// Unix epoch's, which eStargz records as no time at all.
	const dirs = "/usr/bin /usr/lib/python3 /usr/lib/python3.11 /app /data"
	const list = "find " + dirs + " -xdev -printf '%p %T@ %m\\n' 2>/dev/null | sort; find " + dirs + " -xdev -type f 2>/dev/null | sort | xargs -d '\\n' sha256sum"
	lazySums, err := sandboxExec(ctx, tree, runtimetest.Token, "sh", "-c", list)
	if err != nil {
		t.Fatal(err)
	}
	fullSums, err := sandboxExec(ctx, full, runtimetest.Token, "sh", "-c", list)
	if err != nil {
		t.Fatal(err)
	}
	if lazySums != fullSums || strings.Count(lazySums, "\n") < 1000 {
		l, f := strings.Split(lazySums, "\n"), strings.Split(fullSums, "\n")
		t.Errorf("the lazily pulled tree (%d files) differs from the full pull's (%d files): %v", len(l), len(f), lineDiff(l, f, 10))
	}
	for _, uid := range []string{"pytest-1", "pytest-2", "pytest-full", "pytest-tree"} {
		if err := rt.Release(ctx, uid, 0); err != nil {
			t.Fatal(err)
		}
	}
	deleteImagesUnmounted(t, s.Containerd(t, runtimeNamespace), true, res.Target.String(), src.String())
}

// lineDiff lists up to n lines in only one of a and b (- for a, + for b).
func lineDiff(a, b []string, n int) []string {
	in := func(l []string) map[string]bool {
		m := map[string]bool{}
		for _, x := range l {
			m[x] = true
		}
		return m
	}
	ia, ib := in(a), in(b)
	var out []string
	for _, x := range a {
		if !ib[x] && len(out) < n {
			out = append(out, "-"+x)
		}
	}
	for _, x := range b {
		if !ia[x] && len(out) < n {
			out = append(out, "+"+x)
		}
	}
	return out
}

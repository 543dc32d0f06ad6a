//go:build root

package e2e

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/crane"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/nodeimage"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// TestRootImagePrivateOnNode: a private image pod A pulled with its secret
// stays on the node, yet pod B (no secret) and pod C (a wrong one) are
// refused as an unauthorized pull is; pod D (the right secret) gets it with
// no download, a burst of such pods costs one registry check, and a
// restarted manager remembers which images are private. A public image is
// handed out with no registry request at all, and an image from before
// access was recorded is classified by one anonymous check.
func TestRootImagePrivateOnNode(t *testing.T) {
	s := framework.Get(t)
	authHost := startAuthRegistry(t, s, "trainer", "s3cret")
	tag := rand.String(8)
	img := pushRandomImage(t, authHost, "private/task", tag, 2, 256<<10, "trainer", "s3cret")
	proxy := startRegistryProxy(t, authHost)
	ref := proxy.Host + "/private/task:" + tag
	right := [][]byte{dockerConfig(proxy.Host, "trainer", "s3cret")}
	wrong := [][]byte{dockerConfig(proxy.Host, "trainer", "wrong")}
	cc, ns := imageNamespace(t, s)
	ctx := namespaces.WithNamespace(t.Context(), ns)
	m := newImageManager(t, cc, ns)

	label := func() string {
		t.Helper()
		got, err := cc.GetImage(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		return got.Labels()[nodeimage.LabelAccess]
	}
	refused := func(m *nodeimage.Manager, who string, secrets [][]byte) {
		t.Helper()
		_, err := m.Ensure(ctx, ref, secrets)
		if nodeimage.KindOf(err) != nodeimage.KindUnauthorized || !errdefs.IsUnauthorized(err) {
			t.Fatalf("%s: %v, want unauthorized", who, err)
		}
		if err := m.Authorize(ctx, ref, secrets); nodeimage.KindOf(err) != nodeimage.KindUnauthorized {
			t.Fatalf("%s: Authorize said %v, want unauthorized", who, err)
		}
		t.Logf("%s: %v", who, err)
		if !slices.Contains(m.Ready(), ref) {
			t.Fatalf("%s: the cached image left the node", who)
		}
		if got, err := cc.GetImage(ctx, ref); err != nil {
			t.Fatalf("%s: %v", who, err)
		} else if ok, err := got.IsUnpacked(ctx, "overlayfs"); err != nil || !ok {
			t.Fatalf("%s: the cached image lost its layers (%v)", who, err)
		}
	}

	// Pod A pulls it with its secret: private, so labelled.
	if _, err := m.Ensure(ctx, ref, right); err != nil {
		t.Fatalf("pod A: %v", err)
	}
	if proxy.BlobGets() != int64(img.Blobs) {
		t.Fatalf("pod A's pull fetched %d blobs, want %d", proxy.BlobGets(), img.Blobs)
	}
	if got := label(); got != string(nodeimage.AccessPrivate) {
		t.Fatalf("access label %q after a pull that needed credentials, want private", got)
	}
	refused(m, "pod B (no secret)", nil)
	refused(m, "pod C (wrong secret)", wrong)
	// Pod D has pod A's credentials: the pull's own answer, no request.
	before := proxy.Requests()
	if _, err := m.Ensure(ctx, ref, right); err != nil {
		t.Fatalf("pod D: %v", err)
	}
	if got := proxy.Requests() - before; got != 0 {
		t.Errorf("pod D with the puller's credentials sent %d registry requests, want 0", got)
	}

	// A restarted agent remembers the image is private; a burst of pods
	// with the right secret costs one check (an anonymous HEAD, then one
	// with credentials) and no download.
	m2 := newImageManager(t, cc, ns)
	refused(m2, "pod B after a restart", nil)
	before = proxy.Requests()
	var wg sync.WaitGroup
	errs := make([]error, 20)
	for i := range errs {
		wg.Go(func() { _, errs[i] = m2.Ensure(ctx, ref, right) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("pods with the right secret after a restart: %v", err)
	}
	if got := proxy.Requests() - before; got < 1 || got > 4 {
		t.Errorf("20 binds with the right secret sent %d registry requests, want one check (1 to 4 requests)", got)
	}
	if proxy.BlobGets() != int64(img.Blobs) {
		t.Errorf("blobs fetched again: %d in all, want %d", proxy.BlobGets(), img.Blobs)
	}

	// An image from an agent that did not record access: one anonymous
	// check finds it private.
	if _, err := cc.ImageService().Update(ctx, images.Image{Name: ref}, "labels."+nodeimage.LabelAccess); err != nil {
		t.Fatal(err)
	}
	if got := label(); got != "" {
		t.Fatalf("access label %q not removed", got)
	}
	m3 := newImageManager(t, cc, ns)
	refused(m3, "pod B on an unlabelled image", nil)
	if got := label(); got != string(nodeimage.AccessPrivate) {
		t.Fatalf("access label %q after the anonymous check, want private", got)
	}
	if _, err := m3.Ensure(ctx, ref, right); err != nil {
		t.Fatalf("pod D on an unlabelled image: %v", err)
	}

	// A public image: labelled so, shared with every pod, no request.
	pubProxy := startRegistryProxy(t, s.Registry)
	pubTag := rand.String(8)
	pushRandomImage(t, s.Registry, "sandman-test/public", pubTag, 1, 64<<10, "", "")
	pub := pubProxy.Host + "/sandman-test/public:" + pubTag
	if _, err := m.Ensure(ctx, pub, nil); err != nil {
		t.Fatal(err)
	}
	if got, err := cc.GetImage(ctx, pub); err != nil || got.Labels()[nodeimage.LabelAccess] != string(nodeimage.AccessPublic) {
		t.Fatalf("public image's label: %v (%v)", got.Labels(), err)
	}
	before = pubProxy.Requests()
	m4 := newImageManager(t, cc, ns)
	for _, mm := range []*nodeimage.Manager{m, m4} {
		for _, secrets := range [][][]byte{nil, wrong, right} {
			if _, err := mm.Ensure(ctx, pub, secrets); err != nil {
				t.Fatalf("public image: %v", err)
			}
		}
	}
	if got := pubProxy.Requests() - before; got != 0 {
		t.Errorf("binds of a cached public image sent %d registry requests, want 0", got)
	}
}

// TestRootPrivateImageBind: on a node agent's runtime, a pod without the
// private image's secret (or with a wrong one) fails as ErrImagePull
// unauthorized before any slot is taken: the image, the bound pod and the
// image's hot sandbox are untouched, and a pod with the right secret is
// then handed that hot sandbox.
func TestRootPrivateImageBind(t *testing.T) {
	s := framework.Get(t)
	authHost := startAuthRegistry(t, s, "trainer", "s3cret")
	ref := authHost + "/private/busybox:" + rand.String(8)
	if err := crane.Copy(s.BusyboxImage, ref, crane.Insecure,
		crane.WithAuth(&authn.Basic{Username: "trainer", Password: "s3cret"})); err != nil {
		t.Fatalf("copy busybox to the private registry: %v", err)
	}
	right := [][]byte{dockerConfig(authHost, "trainer", "s3cret")}
	rt := newContainerdRuntime(t, s, 3, 1, func(c *noderuntime.Config) { c.HotSlots = 1 })
	ctx := t.Context()

	reqA := runtimetest.Request("priv-a", ref, "sleep", "1000")
	reqA.PullSecrets = right
	slotA, err := rt.Bind(ctx, reqA)
	if err != nil {
		t.Fatalf("pod A with the secret: %v", err)
	}
	// The bind mix makes the image hot.
	var hotID string
	framework.Eventually(t, time.Minute, "a hot sandbox of the private image", func(ctx context.Context) (bool, error) {
		inv, err := rt.Inventory(ctx)
		if err != nil {
			return false, err
		}
		for _, sl := range inv.Slots {
			if sl.State == runtime.StateHot && sl.Image == ref {
				hotID = sl.ID
				return true, nil
			}
		}
		return false, nil
	})

	_, events, err := rt.Watch(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for who, secrets := range map[string][][]byte{
		"priv-b": nil,
		"priv-c": {dockerConfig(authHost, "trainer", "wrong")},
	} {
		req := runtimetest.Request(who, ref, "sleep", "1000")
		req.PullSecrets = secrets
		_, err := rt.Bind(ctx, req)
		if !errors.Is(err, runtime.ErrImagePull) || !errdefs.IsUnauthorized(err) {
			t.Fatalf("%s: %v, want ErrImagePull unauthorized", who, err)
		}
		ev := runtimetest.WaitEvent(t, events, 10*time.Second, who+"'s bind-failed event", func(ev runtime.Event) bool {
			return ev.Type == runtime.EventBindFailed && ev.Slot.Pod != nil && ev.Slot.Pod.UID == who
		})
		if ev.Reason != runtime.ReasonErrImagePull || ev.Slot.ID != "" {
			t.Fatalf("%s: event %+v, want ErrImagePull with no slot", who, ev)
		}
		inv, err := rt.Inventory(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, sl := range inv.Slots {
			switch {
			case sl.ID == hotID && sl.State != runtime.StateHot:
				t.Fatalf("%s: the hot sandbox is %s", who, sl.State)
			case sl.ID == slotA.ID && sl.State != runtime.StateBound:
				t.Fatalf("%s: pod A's slot is %s", who, sl.State)
			}
		}
	}

	reqD := runtimetest.Request("priv-d", ref, "sleep", "1000")
	reqD.PullSecrets = right
	slotD, err := rt.Bind(ctx, reqD)
	if err != nil {
		t.Fatalf("pod D with the secret: %v", err)
	}
	if slotD.ID != hotID {
		t.Errorf("pod D got slot %s, want the hot sandbox %s", slotD.ID, hotID)
	}
	if out, err := sandboxExec(ctx, slotD, runtimetest.Token, "echo", "ok"); err != nil || out != "ok\n" {
		t.Fatalf("exec in pod D: %q %v", out, err)
	}
	for _, uid := range []string{"priv-a", "priv-d"} {
		if err := rt.Release(ctx, uid, time.Second); err != nil {
			t.Fatal(err)
		}
	}
}

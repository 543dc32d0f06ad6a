//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
	vkapi "github.com/sandman-dev/sandman/vk/api"
	vkclient "github.com/sandman-dev/sandman/vk/client"
)

// prepareScript sets a Debian sandbox up as an RL task would: a repository
// cloned (from a local one, offline), a package installed into a
// virtualenv (offline), 100 MB of incompressible files, and a file of the
// image deleted.
const prepareScript = `set -e
mkdir -p /srv/upstream && cd /srv/upstream
git init -q -b main . && git config user.email e2e@sandman.test && git config user.name e2e
echo prepared > README && git add README && git commit -q -m init
git clone -q /srv/upstream /root/repo
python3 -m venv /root/venv
mkdir -p /tmp/pkg/sandpkg && echo 'VALUE = 42' > /tmp/pkg/sandpkg/__init__.py
printf 'from setuptools import setup\nsetup(name="sandpkg", version="1.0", packages=["sandpkg"])\n' > /tmp/pkg/setup.py
/root/venv/bin/pip install -q --no-index --no-build-isolation /tmp/pkg
mkdir -p /root/data
for i in 1 2 3 4; do head -c 25000000 /dev/urandom > /root/data/f$i; done
rm /etc/issue.net
`

// checkScript prints what a sandbox holds of the prepared tree; every fork
// must print what the original printed.
const checkScript = `cd /root/repo && git log --format=%s && cat README
/root/venv/bin/python -c 'import sandpkg; print("sandpkg", sandpkg.VALUE)'
python3 -c 'import sandpkg' 2>/dev/null && echo 'sandpkg outside the venv' || true
stat -c '%n %s' /root/data/f1 /root/data/f2 /root/data/f3 /root/data/f4
md5sum < /root/data/f3
test -e /etc/issue.net && echo 'issue.net there' || echo 'issue.net gone'
test -e /root/fork-only && echo 'fork-only there' || echo 'fork-only absent'
`

// wantCheck is what checkScript must print, but for the checksum.
var wantCheck = regexp.MustCompile(`^init
prepared
sandpkg 42
/root/data/f1 25000000
/root/data/f2 25000000
/root/data/f3 25000000
/root/data/f4 25000000
[0-9a-f]{32}  -
issue.net gone
fork-only absent
$`)

// shell runs script in the sandbox at c and wants exit code 0.
func shell(ctx context.Context, c *client.Client, script string) (string, error) {
	res, err := c.Exec(ctx, api.ExecRequest{Cmd: []string{"sh", "-c", script}, TimeoutSeconds: 240})
	if err != nil {
		return "", err
	}
	if res.ExitCode != 0 {
		return string(res.Stdout), fmt.Errorf("exit %d: %s", res.ExitCode, res.Stderr)
	}
	return string(res.Stdout), nil
}

// manifestOf reads an image's manifest from the registry: its layer
// digests and its config's.
func manifestOf(t *testing.T, registry, repo, digest string) (layers []string, config string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+registry+"/v2/"+repo+"/manifests/"+digest, nil)
	req.Header.Set("Accept", "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m struct {
		Config struct{ Digest string }   `json:"config"`
		Layers []struct{ Digest string } `json:"layers"`
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("manifest %s@%s: %s", repo, digest, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
		t.Fatal(err)
	}
	for _, l := range m.Layers {
		layers = append(layers, l.Digest)
	}
	return layers, m.Config.Digest
}

// removeContainerdNamespace removes an agent's containerd namespace with
// its images (the base image and the snapshots it holds), once the agent
// has stopped.
func removeContainerdNamespace(t *testing.T, s *framework.Stack, ns string) {
	t.Helper()
	cc := s.Containerd(t, ns)
	ctx := namespaces.WithNamespace(context.Background(), ns)
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
		if err := cc.ImageService().Delete(ctx, img.Name, opts...); err != nil {
			t.Errorf("remove image %s from %s: %v", img.Name, ns, err)
		}
	}
	if err := cc.NamespaceService().Delete(ctx, ns); err != nil {
		t.Logf("containerd namespace %s left: %v", ns, err)
	}
}

// tokenOf reads the token sandmanctl keeps for a sandbox.
func tokenOf(t *testing.T, dir, ns, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, ns, name))
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// TestSnapshotForks: a Debian sandbox is prepared (a repository cloned, a
// package installed into a virtualenv, 100 MB written, a file of the image
// deleted) and snapshotted with sandmanctl while it keeps answering; 20
// forks of the snapshot start on the worker that took it without a blob
// from the registry, each sees exactly the prepared tree, and a change in
// one is seen by none of the others nor by the original; a fork on another
// worker, which holds the base image, fetches the new layer and the config
// only. Worker B is the node agent of a pool of its own, so the fork is
// placed there for sure.
func TestSnapshotForks(t *testing.T) {
	s := framework.Get(t)
	var agentNamespaces []string
	// After the subtest's cleanups: the pods are gone, the agents stopped.
	t.Cleanup(func() {
		for _, ns := range agentNamespaces {
			removeContainerdNamespace(t, s, ns)
		}
	})
	t.Run("prepare-snapshot-fork", func(t *testing.T) {
		proxy := startRegistryProxy(t, s.Registry)
		const snapRepo = "sandman-e2e-snap"
		flags := []string{"--snapshot-registry", proxy.Host + "/" + snapRepo}
		pa := startPool(t, s, 1, 24, flags...)
		agentNamespaces = append(agentNamespaces, pa.agents[0].namespace)
		pb := startPool(t, s, 1, 2, flags...)
		agentNamespaces = append(agentNamespaces, pb.agents[0].namespace)
		ctx := t.Context()
		bin := buildBinary(t, s.Root, "sandmanctl")
		tokens := t.TempDir()
		ctl := func(args ...string) (string, string, int) {
			return sandmanctl(t, s, bin, tokens, append([]string{"-n", pa.ns}, args...)...)
		}

		// Prepare the original on A.
		pa.create(pa.newPod("orig", s.DebianImage))
		orig := pa.waitPod("orig", 3*time.Minute, "Ready", podReady)
		oc := daemonAt(t, orig.Status.PodIP, trainerToken)
		start := time.Now()
		if out, err := shell(ctx, oc, prepareScript); err != nil {
			t.Fatalf("prepare the original: %v\n%s", err, out)
		}
		t.Logf("prepared the original in %v", time.Since(start).Round(time.Millisecond))
		want, err := shell(ctx, oc, checkScript)
		if err != nil || !wantCheck.MatchString(want) {
			t.Fatalf("the prepared original holds:\n%s(%v)", want, err)
		}

		// Snapshot it with sandmanctl while exec'ing `true` in it every
		// 100 ms: every call answers (slower while it is frozen).
		var (
			mu       sync.Mutex
			calls    int
			slowest  time.Duration
			execErrs []error
		)
		stop := make(chan struct{})
		pinged := make(chan struct{})
		go func() {
			defer close(pinged)
			tick := time.NewTicker(100 * time.Millisecond) // pacing the calls, not waiting for a condition
			defer tick.Stop()
			for {
				cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				began := time.Now()
				res, err := oc.Exec(cctx, api.ExecRequest{Cmd: []string{"true"}})
				cancel()
				mu.Lock()
				calls++
				slowest = max(slowest, time.Since(began))
				if err == nil && res.ExitCode != 0 {
					err = fmt.Errorf("exit %d", res.ExitCode)
				}
				if err != nil {
					execErrs = append(execErrs, err)
				}
				mu.Unlock()
				select {
				case <-stop:
					return
				case <-tick.C:
				}
			}
		}()
		name := "prep-" + rand.String(6)
		out, errOut, code := ctl("snapshot", "orig", name+":v1")
		close(stop)
		<-pinged
		if code != 0 {
			t.Fatalf("sandmanctl snapshot: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
		}
		t.Logf("sandmanctl snapshot:\n%s", errOut)
		image := proxy.Host + "/" + snapRepo + "/" + name + ":v1"
		ref := strings.TrimSpace(out)
		digest := strings.TrimPrefix(ref, image+"@")
		if !regexp.MustCompile(`^sha256:[0-9a-f]{64}$`).MatchString(digest) || strings.Count(out, "\n") != 1 {
			t.Fatalf("sandmanctl snapshot printed %q, want %s@sha256:… alone", out, image)
		}
		t.Cleanup(func() {
			resp := registryDo(t, http.MethodDelete, "http://"+s.Registry+"/v2/"+snapRepo+"/"+name+"/manifests/"+digest, nil, "", "", "")
			resp.Body.Close()
			if resp.StatusCode != http.StatusAccepted {
				t.Errorf("delete the snapshot's manifest from the registry: %s", resp.Status)
			}
		})
		for _, phase := range []string{"freeze (pausing the sandbox)", "diff (writing the changes)", "commit (sandbox running again", "push"} {
			if !strings.Contains(errOut, "snapshot on "+pa.agents[0].name+": "+phase) {
				t.Errorf("sandmanctl snapshot's progress does not show phase %q on worker %s", phase, pa.agents[0].name)
			}
		}
		summary := regexp.MustCompile(`snapshot of ` + pa.ns + `/orig on ` + pa.node + `: ([0-9.]+) MB of changes as a ([0-9.]+) MB layer, frozen ([0-9]+) ms`).FindStringSubmatch(errOut)
		if summary == nil {
			t.Fatalf("no summary line in sandmanctl snapshot's output")
		}
		changes, _ := strconv.ParseFloat(summary[1], 64)
		layer, _ := strconv.ParseFloat(summary[2], 64)
		if changes < 100 || layer < 100 { // random data does not compress
			t.Errorf("%s MB of changes as a %s MB layer, want at least the 100 MB written", summary[1], summary[2])
		}
		mu.Lock()
		t.Logf("during the snapshot: %d calls to the original, the slowest %v", calls, slowest.Round(time.Millisecond))
		if len(execErrs) > 0 || calls < 2 {
			t.Errorf("calls to the original during the snapshot: %d, failed: %v", calls, execErrs)
		}
		mu.Unlock()
		if out, err := shell(ctx, oc, "echo after"); err != nil || out != "after\n" {
			t.Fatalf("the original after the snapshot: %q %v", out, err)
		}

		// Recorded on the pod: the annotation (polled: a status written
		// meanwhile may carry an older copy until the next one) and the
		// event.
		recorded := func(ctx context.Context) (bool, error) {
			pod, err := s.Kube.CoreV1().Pods(pa.ns).Get(ctx, "orig", metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			var recs []vkapi.SnapshotRecord
			err = json.Unmarshal([]byte(pod.Annotations[podcontract.AnnotationSnapshots]), &recs)
			return err == nil && len(recs) == 1 && recs[0].Image == image && recs[0].Digest == digest && !recs[0].Time.IsZero(), nil
		}
		framework.Eventually(t, 30*time.Second, "annotation "+podcontract.AnnotationSnapshots+" to name the snapshot", recorded)
		framework.Eventually(t, 30*time.Second, "the Snapshotted event", func(ctx context.Context) (bool, error) {
			evs, err := s.Kube.CoreV1().Events(pa.ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=orig,reason=Snapshotted"})
			return err == nil && len(evs.Items) == 1 && evs.Items[0].Type == corev1.EventTypeNormal &&
				strings.HasPrefix(evs.Items[0].Message, "snapshot "+ref+": "), nil
		})
		layers, config := manifestOf(t, s.Registry, snapRepo+"/"+name, digest)
		baseLayers, _ := manifestOf(t, s.Registry, "sandman/debian", "bookworm")
		if len(layers) != len(baseLayers)+1 || !slices.Equal(layers[:len(baseLayers)], baseLayers) {
			t.Fatalf("snapshot layers %v, want the base's %v and one more", layers, baseLayers)
		}
		newLayer := layers[len(layers)-1]

		// 20 forks on A: nothing fetched from the registry.
		gets, reqs := proxy.BlobGets(), proxy.Requests()
		start = time.Now()
		out, errOut, code = ctl("run", "--pool", pa.name, "--image", ref, "--count", "20", "--name", "fork", "--wait", "4m")
		if code != 0 {
			t.Fatalf("sandmanctl run --count 20: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
		}
		t.Logf("20 forks Ready in %v", time.Since(start).Round(time.Millisecond))
		var forks []string
		for line := range strings.Lines(out) {
			forks = append(forks, strings.SplitN(line, "\t", 2)[0])
		}
		if len(forks) != 20 {
			t.Fatalf("sandmanctl run printed %d sandboxes, want 20:\n%s", len(forks), out)
		}
		if n := proxy.BlobGets() - gets; n != 0 {
			t.Errorf("the forks on the snapshot's worker fetched %d blobs from the registry, want none", n)
		}
		t.Logf("registry requests for the forks on A: %d", proxy.Requests()-reqs)
		clients := map[string]*client.Client{}
		for _, f := range forks {
			pod, err := s.Kube.CoreV1().Pods(pa.ns).Get(ctx, f, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if pod.Spec.NodeName != pa.node || pod.Spec.Containers[0].Image != ref {
				t.Fatalf("fork %s on node %q with image %q", f, pod.Spec.NodeName, pod.Spec.Containers[0].Image)
			}
			clients[f] = daemonAt(t, pod.Status.PodIP, tokenOf(t, tokens, pa.ns, f))
		}
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(4)
		for _, f := range forks {
			g.Go(func() error {
				got, err := shell(gctx, clients[f], checkScript)
				if err != nil {
					return fmt.Errorf("fork %s: %v", f, err)
				}
				if got != want {
					return fmt.Errorf("fork %s holds:\n%s\nthe original:\n%s", f, got, want)
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}

		// A change in one fork is its own.
		if _, err := shell(ctx, clients[forks[0]], "echo mine > /root/fork-only && echo changed >> /root/repo/README"); err != nil {
			t.Fatal(err)
		}
		for who, c := range map[string]*client.Client{forks[1]: clients[forks[1]], "the original": oc} {
			if got, err := shell(ctx, c, checkScript); err != nil || got != want {
				t.Errorf("%s after a change in %s:\n%s(%v)", who, forks[0], got, err)
			}
		}
		// The Go client: a snapshot of a fork holds that change alone.
		var lines []vkapi.SnapshotLine
		res, err := vkclient.Snapshot(ctx, s.Kube.CoreV1().RESTClient(), "", vkapi.SnapshotRequest{Namespace: pa.ns, Pod: forks[0], Image: name + ":fork"},
			func(l vkapi.SnapshotLine) { lines = append(lines, l) })
		if err != nil {
			t.Fatalf("vk/client.Snapshot of fork %s: %v", forks[0], err)
		}
		t.Cleanup(func() {
			resp := registryDo(t, http.MethodDelete, "http://"+s.Registry+"/v2/"+snapRepo+"/"+name+"/manifests/"+res.Digest, nil, "", "", "")
			resp.Body.Close()
		})
		if res.Image != proxy.Host+"/"+snapRepo+"/"+name+":fork" || res.BaseImage == "" || res.DiffBytes <= 0 || res.DiffBytes > 1<<20 ||
			len(lines) == 0 || lines[len(lines)-1].Phase != runtime.SnapshotDone {
			t.Errorf("snapshot of a fork: %+v, %d progress lines, want a small diff on its own image", res, len(lines))
		}
		forkLayers, _ := manifestOf(t, s.Registry, snapRepo+"/"+name, res.Digest)
		if len(forkLayers) != len(layers)+1 || !slices.Equal(forkLayers[:len(layers)], layers) {
			t.Errorf("the fork's snapshot has layers %v, want the prepared image's %v and one more", forkLayers, layers)
		}

		// A fork on B, which holds the base image: the new layer and the
		// config are all it fetches.
		pb.create(pb.newPod("base", s.DebianImage))
		pb.waitPod("base", 3*time.Minute, "Ready", podReady)
		before := proxy.BlobGetsByDigest()
		pb.create(pb.newPod("fork-b", ref))
		forkB := pb.waitPod("fork-b", 3*time.Minute, "Ready", podReady)
		after := proxy.BlobGetsByDigest()
		fetched := map[string]int{}
		for d, n := range after {
			if n > before[d] {
				fetched[d] = n - before[d]
			}
		}
		if wantFetched := map[string]int{newLayer: 1, config: 1}; !maps.Equal(fetched, wantFetched) {
			t.Errorf("the fork on worker B fetched %v, want the new layer %s and the config %s once each (base layers %v)",
				fetched, newLayer, config, baseLayers)
		}
		got, err := shell(ctx, daemonAt(t, forkB.Status.PodIP, trainerToken), checkScript)
		if err != nil || got != want {
			t.Errorf("the fork on worker B holds:\n%s(%v)", got, err)
		}
		// The record stays on the original through everything since.
		if ok, err := recorded(ctx); !ok {
			t.Errorf("annotation %s lost on the original (%v)", podcontract.AnnotationSnapshots, err)
		}
	})
}

// TestSnapshotBadInput: a snapshot of a pod that is gone, that waits for a
// slot, or that runs on another node fails with a message that says so; a
// registry that refuses the push and a disk that fills during the diff
// fail the snapshot and leave the sandbox running, not frozen.
func TestSnapshotBadInput(t *testing.T) {
	s := framework.Get(t)
	auth := startAuthRegistry(t, s, "snapper", "secret")
	scratch := t.TempDir()
	if err := unix.Mount("tmpfs", scratch, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size=1m"); err != nil {
		t.Fatalf("mount a 1 MiB tmpfs: %v", err)
	}
	// Registered before the pool: unmounted after its agent stopped.
	t.Cleanup(func() { _ = unix.Unmount(scratch, unix.MNT_DETACH) })
	var agentNamespace string
	t.Cleanup(func() {
		if agentNamespace != "" {
			removeContainerdNamespace(t, s, agentNamespace)
		}
	})
	t.Run("refusals", func(t *testing.T) {
		p := startPool(t, s, 1, 2, "--snapshot-registry", auth+"/sandman-e2e-snap", "--snapshot-scratch-dir", scratch)
		agentNamespace = p.agents[0].namespace
		ctx := t.Context()
		bin := buildBinary(t, s.Root, "sandmanctl")
		tokens := t.TempDir()
		ctl := func(args ...string) (string, string, int) {
			return sandmanctl(t, s, bin, tokens, append([]string{"-n", p.ns}, args...)...)
		}
		refused := func(what string, wantCode int, want string, args ...string) {
			t.Helper()
			out, errOut, code := ctl(append([]string{"snapshot"}, args...)...)
			t.Logf("%s: exit %d: %s", what, code, strings.TrimSpace(errOut))
			if code != wantCode || out != "" || !strings.Contains(errOut, want) {
				t.Errorf("snapshot of %s: exit %d, stdout %q, stderr %q; want exit %d and %q", what, code, out, errOut, wantCode, want)
			}
		}

		p.create(p.newPod("orig", s.DebianImage))
		p.create(p.newPod("filler", s.BusyboxImage))
		orig := p.waitPod("orig", 3*time.Minute, "Ready", podReady)
		p.waitPod("filler", 2*time.Minute, "Ready", podReady)
		p.create(p.newPod("waiting", s.BusyboxImage))
		p.waitPod("waiting", time.Minute, "WaitingForSlot", func(pod *corev1.Pod) bool {
			cs := pod.Status.ContainerStatuses
			return len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == "WaitingForSlot"
		})
		// A pod on the kubelet worker, not on a virtual node.
		worker := s.Env["WORKER_NAME"]
		if _, err := s.Kube.CoreV1().Pods(p.ns).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "elsewhere", Namespace: p.ns},
			Spec: corev1.PodSpec{NodeName: worker, TerminationGracePeriodSeconds: new(int64),
				Containers: []corev1.Container{{Name: "c", Image: s.BusyboxImage, Command: []string{"sleep", "3600"}}}},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}

		refused("a pod that is gone", 3, "pod "+p.ns+"/gone not found", "gone", "x:v1")
		refused("a pod waiting for a slot", 1, "slot", "waiting", "x:v1")
		refused("a pod on the kubelet worker", 1, "runs on node "+worker+", which is not a sandman virtual node", "elsewhere", "x:v1")
		// Asked of this pool's virtual node (the Go client, naming it).
		_, err := vkclient.Snapshot(ctx, s.Kube.CoreV1().RESTClient(), p.node, vkapi.SnapshotRequest{Namespace: p.ns, Pod: "elsewhere", Image: "x:v1"}, nil)
		if err == nil || !strings.Contains(err.Error(), "runs on node "+worker+", not on this pool's virtual node "+p.node) {
			t.Errorf("snapshot through %s of a pod on %s: %v", p.node, worker, err)
		}

		oc := daemonAt(t, orig.Status.PodIP, trainerToken)
		answers := func(after string) {
			t.Helper()
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			if out, err := shell(cctx, oc, "echo alive"); err != nil || out != "alive\n" {
				t.Fatalf("after %s the sandbox does not answer: %q %v", after, out, err)
			}
		}
		if _, err := shell(ctx, oc, "echo small > /root/small"); err != nil {
			t.Fatal(err)
		}
		refused("a pod whose push the registry refuses", 1, "the snapshot registry "+auth+"/sandman-e2e-snap refused the push", "orig", "refused:v1")
		answers("a refused push")

		if _, err := shell(ctx, oc, "head -c 5000000 /dev/urandom > /root/five"); err != nil {
			t.Fatal(err)
		}
		refused("a pod whose changes fill the disk", 1, "the node's disk is full", "orig", "full:v1")
		answers("a full disk")
		if entries, _ := os.ReadDir(scratch); len(entries) > 0 {
			t.Errorf("%d files left in the scratch directory", len(entries))
		}
	})
}

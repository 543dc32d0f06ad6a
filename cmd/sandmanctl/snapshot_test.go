package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	kfake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
	vkapi "github.com/sandman-dev/sandman/vk/api"
)

// testCtl is a ctl over kube with its output kept.
func testCtl(t *testing.T, kube kubernetes.Interface) (*ctl, *strings.Builder, *strings.Builder) {
	var out, errw strings.Builder
	return &ctl{kube: kube, namespace: "ns", tokenDir: t.TempDir(), out: &out, errw: &errw}, &out, &errw
}

func exitCode(err error) int {
	var ce cliError
	if errors.As(err, &ce) {
		return ce.code
	}
	if err != nil {
		return exitError
	}
	return 0
}

// fakeCluster is client-go's fake clientset whose pods get names from
// generateName, and are Ready at once unless notReady says otherwise;
// failCreate, when set, fails the nth create (1-based).
func fakeCluster(notReady func(n int) bool, failCreate int) *kfake.Clientset {
	kube := kfake.NewClientset()
	var n atomic.Int32
	kube.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, kruntime.Object, error) {
		i := int(n.Add(1))
		if i == failCreate {
			return true, nil, fmt.Errorf("pods is forbidden: exceeded quota")
		}
		pod := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
		if pod.Name == "" {
			pod.Name = fmt.Sprintf("%s%05d", pod.GenerateName, i)
		}
		if notReady == nil || !notReady(i) {
			pod.Status.Phase = corev1.PodRunning
			pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		}
		return false, nil, nil
	})
	return kube
}

func TestRunCountCreatesAndWaitsForAll(t *testing.T) {
	kube := fakeCluster(nil, 0)
	c, out, _ := testCtl(t, kube)
	snap := "reg.local/envs/prepared:v1@sha256:feed"
	if err := c.run(t.Context(), []string{"--image", snap, "--count", "5", "--wait", "10s", "--job", "j", "sleep", "1d"}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("output %q", out.String())
	}
	pods, _ := kube.CoreV1().Pods("ns").List(t.Context(), metav1.ListOptions{})
	if len(pods.Items) != 5 {
		t.Fatalf("%d pods", len(pods.Items))
	}
	hashes, runs := map[string]bool{}, map[string]bool{}
	for _, p := range pods.Items {
		hashes[p.Annotations["sandman.io/token-sha256"]] = true
		runs[p.Labels[podcontract.LabelRun]] = true
		if c := p.Spec.Containers[0]; c.Image != snap || !slices.Equal(c.Command, []string{"sleep", "1d"}) || p.Labels["sandman.io/job"] != "j" ||
			!strings.HasPrefix(p.Name, "sandbox-") {
			t.Fatalf("pod %s: %+v", p.Name, p)
		}
	}
	if len(hashes) != 5 || len(runs) != 1 {
		t.Fatalf("token hashes %v, runs %v", hashes, runs)
	}
	for _, l := range lines {
		name, file, _ := strings.Cut(l, "\t")
		fi, err := os.Stat(file)
		if err != nil || fi.Mode().Perm() != 0o600 || filepath.Base(file) != name || filepath.Base(filepath.Dir(file)) != "ns" {
			t.Fatalf("token file of %s: %s %v", name, file, err)
		}
	}
}

func TestRunCountNamesThoseNotReady(t *testing.T) {
	kube := fakeCluster(func(n int) bool { return n == 2 }, 0)
	c, out, _ := testCtl(t, kube)
	err := c.run(t.Context(), []string{"--count", "3", "--name", "env", "--wait", "500ms", "img"})
	if exitCode(err) != exitError || !strings.Contains(err.Error(), "1 of 3 sandboxes are not Ready") || !strings.Contains(err.Error(), "sandbox env-00002 not Ready after 500ms") {
		t.Fatalf("got %v", err)
	}
	if got := strings.Count(out.String(), "\n"); got != 2 || strings.Contains(out.String(), "env-00002") {
		t.Fatalf("ready ones printed: %q", out.String())
	}
}

func TestRunCountUndoesAFailedCreate(t *testing.T) {
	kube := fakeCluster(nil, 3)
	c, out, _ := testCtl(t, kube)
	err := c.run(t.Context(), []string{"--count", "4", "img"})
	if err == nil || !strings.Contains(err.Error(), "exceeded quota") || !strings.Contains(err.Error(), "deleted again") {
		t.Fatalf("got %v", err)
	}
	pods, _ := kube.CoreV1().Pods("ns").List(t.Context(), metav1.ListOptions{})
	if len(pods.Items) != 0 || out.Len() != 0 {
		t.Fatalf("left %d pods, printed %q", len(pods.Items), out.String())
	}
	if files, _ := filepath.Glob(filepath.Join(c.tokenDir, "ns", "*")); len(files) != 0 {
		t.Fatalf("token files left: %v", files)
	}
}

func TestRunAndSnapshotUsage(t *testing.T) {
	c, _, _ := testCtl(t, kfake.NewClientset())
	for _, args := range [][]string{{"run"}, {"run", "--count", "0", "img"}, {"snapshot"}, {"snapshot", "pod"}, {"snapshot", "pod", "img", "extra"}} {
		if err := c.dispatch(t.Context(), args[0], args[1:]); exitCode(err) != exitUsage {
			t.Errorf("%v: %v", args, err)
		}
	}
}

func TestSnapshotProgress(t *testing.T) {
	var b strings.Builder
	p := &snapshotProgress{out: &b}
	for _, l := range []vkapi.SnapshotLine{
		{Node: "w1", ElapsedMS: 10, SnapshotProgress: runtime.SnapshotProgress{Phase: runtime.SnapshotFreeze}},
		{Node: "w1", ElapsedMS: 400, SnapshotProgress: runtime.SnapshotProgress{Phase: runtime.SnapshotDiff, BytesDone: 1_000_000}},
		{Node: "w1", ElapsedMS: 900, SnapshotProgress: runtime.SnapshotProgress{Phase: runtime.SnapshotDiff, BytesDone: 5_000_000}},
		{Node: "w1", ElapsedMS: 2500, SnapshotProgress: runtime.SnapshotProgress{Phase: runtime.SnapshotPush, BytesDone: 1_000_000, BytesTotal: 4_000_000}},
	} {
		p.show(l)
	}
	p.end()
	want := "snapshot on w1: freeze (pausing the sandbox)  0s\n" +
		"snapshot on w1: diff (writing the changes)  1.0 MB  400ms\n" +
		"snapshot on w1: push  1.0 MB / 4.0 MB (25%)  2.5s\n"
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}

	b.Reset()
	p = &snapshotProgress{out: &b, tty: true}
	p.show(vkapi.SnapshotLine{SnapshotProgress: runtime.SnapshotProgress{Phase: runtime.SnapshotFreeze}})
	p.show(vkapi.SnapshotLine{SnapshotProgress: runtime.SnapshotProgress{Phase: runtime.SnapshotFreeze}, ElapsedMS: 5000})
	p.end()
	if got := b.String(); strings.Count(got, "\r\x1b[2K") != 2 || !strings.HasSuffix(got, "5s\n") {
		t.Fatalf("terminal: %q", got)
	}
}

// TestSnapshotCommand runs `snapshot` against a stand-in apiserver: the pod,
// its virtual node, and the node proxy's snapshot stream.
func TestSnapshotCommand(t *testing.T) {
	var mu sync.Mutex
	var asked vkapi.SnapshotRequest
	mux := http.NewServeMux()
	writeJSON := func(w http.ResponseWriter, status int, v any) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(v)
	}
	mux.HandleFunc("GET /api/v1/namespaces/ns/pods/{name}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("name") != "box" {
			writeJSON(w, 404, metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: "Failure",
				Reason: metav1.StatusReasonNotFound, Code: 404, Message: fmt.Sprintf("pods %q not found", r.PathValue("name"))})
			return
		}
		writeJSON(w, 200, corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "box", Namespace: "ns"}, Spec: corev1.PodSpec{NodeName: "sandman-p"}})
	})
	mux.HandleFunc("GET /api/v1/nodes/sandman-p", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "sandman-p", Labels: map[string]string{"sandman.io/pool": "p"}}})
	})
	mux.HandleFunc("POST /api/v1/nodes/sandman-p/proxy/sandman/v1/snapshot", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		_ = json.NewDecoder(r.Body).Decode(&asked)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		for _, ph := range []runtime.SnapshotPhase{runtime.SnapshotFreeze, runtime.SnapshotDiff, runtime.SnapshotCommit, runtime.SnapshotPush} {
			_ = enc.Encode(vkapi.SnapshotLine{Time: time.Now(), Node: "w1", SnapshotProgress: runtime.SnapshotProgress{Phase: ph}})
		}
		_ = enc.Encode(vkapi.SnapshotLine{Time: time.Now(), Node: "w1", SnapshotProgress: runtime.SnapshotProgress{Phase: runtime.SnapshotDone},
			Result: &runtime.SnapshotResult{Image: "reg.local/envs/x:1", Digest: "sha256:feed", DiffBytes: 2_000_000, LayerBytes: 500_000,
				Frozen: 30 * time.Millisecond, Duration: 2 * time.Second}})
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	kube, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	c, out, errw := testCtl(t, kube)
	if err := c.snapshot(t.Context(), []string{"--container", "task", "box", "envs/x:1"}); err != nil {
		t.Fatal(err)
	}
	if out.String() != "reg.local/envs/x:1@sha256:feed\n" {
		t.Fatalf("stdout %q", out.String())
	}
	if asked != (vkapi.SnapshotRequest{Namespace: "ns", Pod: "box", Container: "task", Image: "envs/x:1"}) {
		t.Fatalf("asked %+v", asked)
	}
	for _, want := range []string{"freeze", "diff", "commit", "push", "snapshot of ns/box on sandman-p: 2.0 MB of changes as a 0.5 MB layer, frozen 30 ms, 2s in all"} {
		if !strings.Contains(errw.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, errw.String())
		}
	}

	c, out, _ = testCtl(t, kube)
	err = c.snapshot(t.Context(), []string{"gone", "envs/x:1"})
	if exitCode(err) != exitNotFound || err.Error() != "snapshot: pod ns/gone not found" || out.Len() != 0 {
		t.Fatalf("gone: %v", err)
	}
}

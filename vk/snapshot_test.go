package vk

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"

	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/fake"
	vkapi "github.com/sandman-dev/sandman/vk/api"
	vkclient "github.com/sandman-dev/sandman/vk/client"
)

// snapshotter is a fake node agent seen through runtime.Runtime only, with
// a Snapshot of the test's own.
type snapshotter struct {
	runtime.Runtime
	snap func(context.Context, runtime.SnapshotRequest, func(runtime.SnapshotProgress)) (runtime.SnapshotResult, error)
}

func (s snapshotter) Snapshot(ctx context.Context, req runtime.SnapshotRequest, progress func(runtime.SnapshotProgress)) (runtime.SnapshotResult, error) {
	return s.snap(ctx, req, progress)
}

// snapshotHarness is a provider whose node agent snapshots with snap, its
// API served over HTTP, and its events.
type snapshotHarness struct {
	*harness
	url    string
	events chan string
}

func newSnapshotHarness(t *testing.T, slots int, snap func(context.Context, runtime.SnapshotRequest, func(runtime.SnapshotProgress)) (runtime.SnapshotResult, error)) *snapshotHarness {
	t.Helper()
	rec := record.NewFakeRecorder(100)
	h := newHarnessWith(t, slots, func(f *fake.Runtime) runtime.Runtime { return snapshotter{Runtime: f, snap: snap} },
		func(c *Config) { c.Recorder = rec })
	mux := http.NewServeMux()
	h.p.AttachAPI(mux)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return &snapshotHarness{harness: h, url: srv.URL, events: rec.Events}
}

// run creates pod in the API and on the virtual node, and waits for it
// to be Ready (or, with wait false, only submits it).
func (h *snapshotHarness) run(t *testing.T, pod *corev1.Pod, wait bool) {
	t.Helper()
	if _, err := h.client.CoreV1().Pods(pod.Namespace).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.p.CreatePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	if wait {
		h.wait(t, pod.UID, pod.Name+" ready", isReady)
	}
}

// call posts a snapshot request and returns the status and the body's
// lines (or the Status of a refusal).
func (h *snapshotHarness) call(t *testing.T, req vkapi.SnapshotRequest) (int, []vkapi.SnapshotLine, metav1.Status) {
	t.Helper()
	body, _ := json.Marshal(req)
	resp, err := http.Post(h.url+vkapi.APIPrefix+"snapshot", "application/json", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var status metav1.Status
	if resp.StatusCode != http.StatusOK {
		if err := json.NewDecoder(resp.Body).Decode(&status); err != nil {
			t.Fatalf("%s: %v", resp.Status, err)
		}
		return resp.StatusCode, nil, status
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/x-ndjson" {
		t.Fatalf("content type %q", ct)
	}
	var lines []vkapi.SnapshotLine
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var l vkapi.SnapshotLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		lines = append(lines, l)
	}
	return resp.StatusCode, lines, status
}

func steps(progress func(runtime.SnapshotProgress)) {
	progress(runtime.SnapshotProgress{Phase: runtime.SnapshotFreeze})
	progress(runtime.SnapshotProgress{Phase: runtime.SnapshotDiff, BytesDone: 3 << 20})
	progress(runtime.SnapshotProgress{Phase: runtime.SnapshotCommit})
	progress(runtime.SnapshotProgress{Phase: runtime.SnapshotPush, BytesDone: 1 << 20, BytesTotal: 2 << 20})
}

func TestSnapshotStreamsAndRecords(t *testing.T) {
	var asked runtime.SnapshotRequest
	h := newSnapshotHarness(t, 2, func(_ context.Context, req runtime.SnapshotRequest, progress func(runtime.SnapshotProgress)) (runtime.SnapshotResult, error) {
		asked = req
		steps(progress)
		return runtime.SnapshotResult{Image: "reg.local/envs/prepared:v1", Digest: "sha256:feed", BaseImage: "img",
			DiffBytes: 12_500_000, Frozen: 42 * time.Millisecond, Duration: time.Second}, nil
	})
	pod := testPod("a", "img")
	// Earlier snapshots stay, the oldest dropped beyond the cap.
	var earlier []vkapi.SnapshotRecord
	for i := range vkapi.MaxSnapshotRecords {
		earlier = append(earlier, vkapi.SnapshotRecord{Image: fmt.Sprintf("old:%d", i), Digest: "sha256:0"})
	}
	b, _ := json.Marshal(earlier)
	pod.Annotations[podcontract.AnnotationSnapshots] = string(b)
	h.run(t, pod, true)

	status, lines, st := h.call(t, vkapi.SnapshotRequest{Namespace: "ns", Pod: "a", Image: "envs/prepared:v1"})
	if status != http.StatusOK {
		t.Fatalf("%d %+v", status, st)
	}
	if asked.PodUID != "uid-a" || asked.Image != "envs/prepared:v1" || asked.Container != "" {
		t.Fatalf("node asked %+v", asked)
	}
	var phases []string
	for _, l := range lines {
		phases = append(phases, string(l.Phase))
		if l.Node != "w1" || l.Time.IsZero() {
			t.Fatalf("line %+v", l)
		}
	}
	if got := strings.Join(phases, " "); got != "freeze diff commit push done" {
		t.Fatalf("phases %q", got)
	}
	end := lines[len(lines)-1]
	if end.Result == nil || end.Result.Digest != "sha256:feed" || end.Error != "" {
		t.Fatalf("last line %+v", end)
	}

	got, err := h.client.CoreV1().Pods("ns").Get(t.Context(), "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var list []vkapi.SnapshotRecord
	if err := json.Unmarshal([]byte(got.Annotations[podcontract.AnnotationSnapshots]), &list); err != nil {
		t.Fatal(err)
	}
	if len(list) != vkapi.MaxSnapshotRecords || list[0].Image != "old:1" ||
		list[len(list)-1].Image != "reg.local/envs/prepared:v1" || list[len(list)-1].Digest != "sha256:feed" || list[len(list)-1].Time.IsZero() {
		t.Fatalf("annotation %s", got.Annotations[podcontract.AnnotationSnapshots])
	}
	// The pod the provider hands over with its status carries it too:
	// virtual-kubelet writes it through pods/status, annotations included.
	mine, err := h.p.GetPod(t.Context(), "ns", "a")
	if err != nil || mine.Annotations[podcontract.AnnotationSnapshots] != got.Annotations[podcontract.AnnotationSnapshots] {
		t.Fatalf("the provider's pod: %v %q, want the annotation written", err, mine.Annotations[podcontract.AnnotationSnapshots])
	}
	select {
	case ev := <-h.events:
		if want := "Normal Snapshotted snapshot reg.local/envs/prepared:v1@sha256:feed: 12.5 MB of changes, frozen 42 ms"; ev != want {
			t.Fatalf("event %q, want %q", ev, want)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no Snapshotted event")
	}
}

func TestSnapshotErrorAfterTheStreamBeganIsTheLastLine(t *testing.T) {
	h := newSnapshotHarness(t, 1, func(_ context.Context, _ runtime.SnapshotRequest, progress func(runtime.SnapshotProgress)) (runtime.SnapshotResult, error) {
		steps(progress)
		return runtime.SnapshotResult{}, fmt.Errorf("push reg.local/envs/x:1: 403 denied: %w", errdefs.ErrPermissionDenied)
	})
	h.run(t, testPod("a", "img"), true)
	status, lines, _ := h.call(t, vkapi.SnapshotRequest{Namespace: "ns", Pod: "a", Image: "envs/x:1"})
	if status != http.StatusOK || len(lines) == 0 {
		t.Fatalf("%d %v", status, lines)
	}
	end := lines[len(lines)-1]
	if end.Code != vkapi.CodePermissionDenied || end.Phase != runtime.SnapshotPush || end.Result != nil ||
		!strings.Contains(end.Error, "snapshot of pod ns/a on node w1: push reg.local/envs/x:1: 403 denied") {
		t.Fatalf("last line %+v", end)
	}
	got, _ := h.client.CoreV1().Pods("ns").Get(t.Context(), "a", metav1.GetOptions{})
	if v := got.Annotations[podcontract.AnnotationSnapshots]; v != "" {
		t.Fatalf("a failed snapshot was recorded: %s", v)
	}
}

func TestSnapshotRefusedBeforeTheStream(t *testing.T) {
	h := newSnapshotHarness(t, 1, func(context.Context, runtime.SnapshotRequest, func(runtime.SnapshotProgress)) (runtime.SnapshotResult, error) {
		return runtime.SnapshotResult{}, fmt.Errorf("no such image repository: %w", errdefs.ErrInvalidArgument)
	})
	h.run(t, testPod("bound", "img"), true)
	// The only slot is taken: this one waits.
	h.run(t, testPod("queued", "img"), false)
	h.wait(t, "uid-queued", "queued waits", func(p *corev1.Pod) bool {
		return len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Waiting != nil &&
			p.Status.ContainerStatuses[0].State.Waiting.Reason == "WaitingForSlot"
	})
	elsewhere := testPod("elsewhere", "img")
	elsewhere.Spec.NodeName = "worker-7"
	if _, err := h.client.CoreV1().Pods("ns").Create(t.Context(), elsewhere, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	untaken := testPod("untaken", "img")
	if _, err := h.client.CoreV1().Pods("ns").Create(t.Context(), untaken, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	two := testPod("two", "img")
	two.Spec.Containers = append(two.Spec.Containers, corev1.Container{Name: "side", Image: "img"})
	if _, err := h.client.CoreV1().Pods("ns").Create(t.Context(), two, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name   string
		req    vkapi.SnapshotRequest
		status int
		code   string
		want   string
	}{
		{"no image", vkapi.SnapshotRequest{Namespace: "ns", Pod: "bound"}, 400, vkapi.CodeInvalidArgument, `want {"namespace"`},
		{"pod gone", vkapi.SnapshotRequest{Namespace: "ns", Pod: "gone", Image: "x:1"}, 404, vkapi.CodeNotFound, "pod ns/gone not found"},
		{"another node", vkapi.SnapshotRequest{Namespace: "ns", Pod: "elsewhere", Image: "x:1"}, 409, vkapi.CodeFailedPrecondition,
			"pod ns/elsewhere runs on node worker-7, not on this pool's virtual node vn"},
		{"not taken by the virtual node", vkapi.SnapshotRequest{Namespace: "ns", Pod: "untaken", Image: "x:1"}, 409, vkapi.CodeFailedPrecondition,
			"pod ns/untaken is not bound to a slot (the virtual node has not taken it yet)"},
		{"waiting for a slot", vkapi.SnapshotRequest{Namespace: "ns", Pod: "queued", Image: "x:1"}, 409, vkapi.CodeFailedPrecondition,
			"pod ns/queued is not bound to a slot yet (WaitingForSlot)"},
		{"which container", vkapi.SnapshotRequest{Namespace: "ns", Pod: "two", Image: "x:1"}, 400, vkapi.CodeInvalidArgument,
			"pod ns/two has 2 containers (task, side): name the one to snapshot"},
		{"no such container", vkapi.SnapshotRequest{Namespace: "ns", Pod: "bound", Container: "nope", Image: "x:1"}, 400, vkapi.CodeInvalidArgument,
			`pod ns/bound has no container "nope" (it has task)`},
		{"the node refuses before any progress", vkapi.SnapshotRequest{Namespace: "ns", Pod: "bound", Image: "x:1"}, 400, vkapi.CodeInvalidArgument,
			"snapshot of pod ns/bound on node w1: no such image repository"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, lines, st := h.call(t, tc.req)
			if status != tc.status || lines != nil {
				t.Fatalf("status %d lines %v: %+v", status, lines, st)
			}
			if st.Kind != "Status" || st.Code != int32(tc.status) || !strings.Contains(st.Message, tc.want) ||
				st.Details == nil || len(st.Details.Causes) != 1 || st.Details.Causes[0].Message != tc.code {
				t.Fatalf("status %+v, want %q (%s)", st, tc.want, tc.code)
			}
		})
	}
}

func TestAppendSnapshotRecord(t *testing.T) {
	rec := vkapi.SnapshotRecord{Image: "new", Digest: "sha256:1"}
	if got := appendSnapshotRecord("", rec); len(got) != 1 || got[0] != rec {
		t.Fatalf("empty: %+v", got)
	}
	if got := appendSnapshotRecord("{not json", rec); len(got) != 1 || got[0] != rec {
		t.Fatalf("unreadable: %+v", got)
	}
	if got := appendSnapshotRecord(`[{"image":"a","digest":"sha256:0","time":"2025-01-02T03:04:05Z"}]`, rec); len(got) != 2 || got[0].Image != "a" || got[1] != rec {
		t.Fatalf("one before: %+v", got)
	}
}

// TestSnapshotThroughTheClient: vk/client's Snapshot, as trainer code and
// sandmanctl call it, against the route behind a stand-in for the
// apiserver (pods and nodes read from the fake clientset, the node proxy
// passing the virtual node's answers through).
func TestSnapshotThroughTheClient(t *testing.T) {
	h := newSnapshotHarness(t, 1, func(_ context.Context, req runtime.SnapshotRequest, progress func(runtime.SnapshotProgress)) (runtime.SnapshotResult, error) {
		steps(progress)
		if strings.Contains(req.Image, "denied") {
			return runtime.SnapshotResult{}, fmt.Errorf("push: %w", errdefs.ErrPermissionDenied)
		}
		return runtime.SnapshotResult{Image: "reg.local/" + req.Image, Digest: "sha256:feed"}, nil
	})
	h.run(t, testPod("a", "img"), true)
	if _, err := h.client.CoreV1().Pods("ns").Create(t.Context(), testPod("untaken", "img"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.CoreV1().Nodes().Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "vn",
		Labels: map[string]string{podcontract.LabelPool: "t"}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	vnode := http.NewServeMux()
	h.p.AttachAPI(vnode)
	apiserver := http.NewServeMux()
	apiserver.Handle("/api/v1/nodes/vn/proxy/", http.StripPrefix("/api/v1/nodes/vn/proxy", vnode))
	object := func(w http.ResponseWriter, obj any, err error) {
		w.Header().Set("Content-Type", "application/json")
		if err != nil {
			st := apierrors.APIStatus(nil)
			if errors.As(err, &st) {
				w.WriteHeader(int(st.Status().Code))
				_ = json.NewEncoder(w).Encode(st.Status())
				return
			}
			w.WriteHeader(500)
			return
		}
		_ = json.NewEncoder(w).Encode(obj)
	}
	apiserver.HandleFunc("GET /api/v1/namespaces/{ns}/pods/{name}", func(w http.ResponseWriter, r *http.Request) {
		pod, err := h.client.CoreV1().Pods(r.PathValue("ns")).Get(r.Context(), r.PathValue("name"), metav1.GetOptions{})
		object(w, pod, err)
	})
	apiserver.HandleFunc("GET /api/v1/nodes/{name}", func(w http.ResponseWriter, r *http.Request) {
		node, err := h.client.CoreV1().Nodes().Get(r.Context(), r.PathValue("name"), metav1.GetOptions{})
		object(w, node, err)
	})
	srv := httptest.NewServer(apiserver)
	defer srv.Close()
	kube, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL})
	if err != nil {
		t.Fatal(err)
	}
	rc := kube.CoreV1().RESTClient()

	var phases []string
	res, err := vkclient.Snapshot(t.Context(), rc, "", vkapi.SnapshotRequest{Namespace: "ns", Pod: "a", Image: "envs/x:1"}, func(l vkapi.SnapshotLine) {
		phases = append(phases, string(l.Phase))
	})
	if err != nil || res.Image != "reg.local/envs/x:1" || res.Digest != "sha256:feed" {
		t.Fatalf("snapshot: %+v %v", res, err)
	}
	if got := strings.Join(phases, " "); got != "freeze diff commit push" {
		t.Fatalf("progress %q", got)
	}

	for _, tc := range []struct {
		name  string
		req   vkapi.SnapshotRequest
		class error
		want  string
	}{
		{"pod gone", vkapi.SnapshotRequest{Namespace: "ns", Pod: "gone", Image: "x:1"}, errdefs.ErrNotFound, "pod ns/gone not found"},
		{"not bound", vkapi.SnapshotRequest{Namespace: "ns", Pod: "untaken", Image: "x:1"}, errdefs.ErrFailedPrecondition,
			"pod ns/untaken is not bound to a slot (the virtual node has not taken it yet)"},
		{"refused after the stream began", vkapi.SnapshotRequest{Namespace: "ns", Pod: "a", Image: "denied:1"}, errdefs.ErrPermissionDenied,
			"snapshot of pod ns/a on node w1: push"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := vkclient.Snapshot(t.Context(), rc, "", tc.req, nil)
			var apiErr *vkapi.Error
			if !errors.As(err, &apiErr) || !errors.Is(err, tc.class) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q (%v)", err, tc.want, tc.class)
			}
		})
	}
	// A pod on a node that is not a virtual node of sandman.
	elsewhere := testPod("elsewhere", "img")
	elsewhere.Spec.NodeName = "worker-7"
	_, _ = h.client.CoreV1().Pods("ns").Create(t.Context(), elsewhere, metav1.CreateOptions{})
	_, _ = h.client.CoreV1().Nodes().Create(t.Context(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "worker-7"}}, metav1.CreateOptions{})
	if _, err := vkclient.PodNode(t.Context(), rc, "ns", "elsewhere"); !errdefs.IsInvalidArgument(err) ||
		err.Error() != "pod ns/elsewhere runs on node worker-7, which is not a sandman virtual node (no sandman.io/pool label)" {
		t.Fatalf("pod on another node: %v", err)
	}
}

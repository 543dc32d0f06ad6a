package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/sandman-dev/sandman/runtime"
	vkapi "github.com/sandman-dev/sandman/vk/api"
)

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

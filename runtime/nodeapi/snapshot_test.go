package nodeapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/fake"
	"github.com/sandman-dev/sandman/runtime/nodeapi"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// TestSnapshot: the fake node's snapshots, taken directly and over the
// wire, report every phase, make the image ready on the node (a fork binds
// where the registry would not have it otherwise), and fail with the
// errdefs class the runtime gave, message included.
func TestSnapshot(t *testing.T) {
	const registry = "registry.test:5000/snaps"
	var fail error
	rt, err := fake.New(fake.Config{Node: "snap-1", Slots: 4, Images: []string{"busybox"}, SnapshotRegistry: registry,
		FailSnapshot: func(runtime.SnapshotRequest) error { return fail }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	srv, err := nodeapi.NewServer(nodeapi.ServerConfig{Runtime: rt, Token: "pool-secret"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { ts.CloseClientConnections(); ts.Close() })
	ctx := t.Context()
	if _, err := rt.Bind(ctx, runtimetest.Request("orig", "busybox")); err != nil {
		t.Fatal(err)
	}
	two := runtimetest.Request("two", "busybox")
	two.Containers = append(two.Containers, runtime.ContainerSpec{Name: "side", Image: "busybox"})
	if _, err := rt.Bind(ctx, two); err != nil {
		t.Fatal(err)
	}

	for i, sn := range []struct {
		name string
		sn   runtime.Snapshotter
	}{{"direct", rt}, {"wire", nodeapi.NewClient(ts.URL, "pool-secret", nil)}} {
		t.Run(sn.name, func(t *testing.T) {
			fail = nil
			var phases []runtime.SnapshotPhase
			image := fmt.Sprintf("env-%d:v1", i)
			res, err := sn.sn.Snapshot(ctx, runtime.SnapshotRequest{PodUID: "orig", Image: image}, func(p runtime.SnapshotProgress) {
				phases = append(phases, p.Phase)
			})
			if err != nil {
				t.Fatal(err)
			}
			if want := registry + "/" + image; res.Image != want || res.BaseImage != "busybox" || res.Digest == "" || res.LayerBytes == 0 {
				t.Errorf("result %+v, want image %s from busybox", res, want)
			}
			if want := []runtime.SnapshotPhase{runtime.SnapshotFreeze, runtime.SnapshotDiff, runtime.SnapshotCommit,
				runtime.SnapshotPush, runtime.SnapshotDone}; !slices.Equal(phases, want) {
				t.Errorf("phases %v, want %v", phases, want)
			}
			inv, _ := rt.Inventory(ctx)
			if !slices.Contains(inv.ReadyImages, res.Image) {
				t.Errorf("the snapshot is not ready on the node: %v", inv.ReadyImages)
			}
			fork := fmt.Sprintf("fork-%d", i)
			if _, err := rt.Bind(ctx, runtimetest.Request(fork, res.Image)); err != nil {
				t.Errorf("fork: %v", err)
			}
			_ = rt.Release(ctx, fork, 0)

			for _, tc := range []struct {
				what  string
				req   runtime.SnapshotRequest
				fail  error
				class func(error) bool
				msg   string
			}{
				{"unknown pod", runtime.SnapshotRequest{PodUID: "nope", Image: "x:v1"}, nil, errdefs.IsNotFound, "not on node"},
				{"several containers", runtime.SnapshotRequest{PodUID: "two", Image: "x:v1"}, nil, errdefs.IsInvalidArgument, "task, side"},
				{"unknown container", runtime.SnapshotRequest{PodUID: "two", Container: "nope", Image: "x:v1"}, nil, errdefs.IsInvalidArgument, "task, side"},
				{"other registry", runtime.SnapshotRequest{PodUID: "orig", Image: "docker.io/library/x:v1"}, nil, errdefs.IsInvalidArgument, registry},
				{"push refused", runtime.SnapshotRequest{PodUID: "orig", Image: "x:v1"},
					fmt.Errorf("the snapshot registry %s refused the push: no basic auth credentials: %w", registry, errdefs.ErrUnauthenticated), errdefs.IsUnauthorized, "no basic auth"},
				{"push denied", runtime.SnapshotRequest{PodUID: "orig", Image: "x:v1"},
					fmt.Errorf("denied: %w", errdefs.ErrPermissionDenied), errdefs.IsPermissionDenied, "denied"},
				{"disk full", runtime.SnapshotRequest{PodUID: "orig", Image: "x:v1"},
					fmt.Errorf("the node's disk is full: %w", errdefs.ErrResourceExhausted), errdefs.IsResourceExhausted, "disk is full"},
				{"registry away", runtime.SnapshotRequest{PodUID: "orig", Image: "x:v1"},
					fmt.Errorf("did not answer: %w", errdefs.ErrUnavailable), errdefs.IsUnavailable, "did not answer"},
			} {
				fail = tc.fail
				_, err := sn.sn.Snapshot(ctx, tc.req, nil)
				if !tc.class(err) || !strings.Contains(err.Error(), tc.msg) {
					t.Errorf("%s: %v, want another class or a message with %q", tc.what, err, tc.msg)
				}
			}
		})
	}
	if n := len(rt.Snapshots()); n != 2 {
		t.Errorf("the node recorded %d snapshots, want 2", n)
	}
}

// TestSnapshotRoute: POST /v1/snapshot is authenticated and fenced like
// every mutating call, refuses a body without pod and image before any
// snapshot, and says so when the runtime cannot take snapshots.
func TestSnapshotRoute(t *testing.T) {
	rt, err := fake.New(fake.Config{Node: "snap-2", Slots: 1, SnapshotRegistry: "registry.test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rt.Close)
	ctx := t.Context()
	if _, err := rt.Bind(ctx, runtimetest.Request("p", "busybox")); err != nil {
		t.Fatal(err)
	}
	srv, err := nodeapi.NewServer(nodeapi.ServerConfig{Runtime: rt, Token: "pool-secret"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() { ts.CloseClientConnections(); ts.Close() })
	req := runtime.SnapshotRequest{PodUID: "p", Image: "x:v1"}

	if _, err := nodeapi.NewClient(ts.URL, "wrong", nil).Snapshot(ctx, req, nil); !errdefs.IsUnauthorized(err) {
		t.Errorf("wrong token: %v", err)
	}
	if _, err := nodeapi.NewClient(ts.URL, "pool-secret", nil).Snapshot(ctx, runtime.SnapshotRequest{PodUID: "p"}, nil); !errdefs.IsInvalidArgument(err) ||
		!strings.Contains(err.Error(), "required") {
		t.Errorf("no image: %v", err)
	}
	epoch := uint64(5)
	leader := nodeapi.NewClient(ts.URL, "pool-secret", nil).WithLeaderEpoch(func() uint64 { return epoch })
	if err := leader.Claim(ctx); err != nil {
		t.Fatal(err)
	}
	stale := nodeapi.NewClient(ts.URL, "pool-secret", nil).WithLeaderEpoch(func() uint64 { return 4 })
	if _, err := stale.Snapshot(ctx, req, nil); !errors.Is(err, nodeapi.ErrStaleLeader) {
		t.Errorf("a deposed leader's snapshot: %v, want ErrStaleLeader", err)
	}
	if _, err := leader.Snapshot(ctx, req, nil); err != nil {
		t.Errorf("the leader's snapshot: %v", err)
	}
	if n := len(rt.Snapshots()); n != 1 {
		t.Errorf("%d snapshots taken, want only the leader's", n)
	}

	// A runtime without snapshots.
	plain, err := nodeapi.NewServer(nodeapi.ServerConfig{Runtime: &recorder{}, Token: "pool-secret"})
	if err != nil {
		t.Fatal(err)
	}
	pts := httptest.NewServer(plain.Handler())
	t.Cleanup(pts.Close)
	_, err = nodeapi.NewClient(pts.URL, "pool-secret", nil).Snapshot(ctx, req, nil)
	if err == nil || !strings.Contains(err.Error(), "cannot take snapshots") {
		t.Errorf("a runtime without snapshots: %v", err)
	}
}

// snapshotRecorder is a runtime that records the snapshot requests the
// node API hands it.
type snapshotRecorder struct {
	recorder
	got []runtime.SnapshotRequest
}

func (r *snapshotRecorder) Snapshot(_ context.Context, req runtime.SnapshotRequest, progress func(runtime.SnapshotProgress)) (runtime.SnapshotResult, error) {
	r.got = append(r.got, req)
	progress(runtime.SnapshotProgress{Phase: runtime.SnapshotDone})
	return runtime.SnapshotResult{Image: req.Image}, nil
}

// FuzzSnapshotBody: POST /v1/snapshot with any body either reaches the
// runtime as exactly the request it holds, answered as a stream, or is
// refused with a 400 invalid_argument that says what is wrong.
func FuzzSnapshotBody(f *testing.F) {
	for _, seed := range []string{
		`{"pod_uid":"u","image":"x:v1"}`, `{"pod_uid":"u","container":"main","image":"reg.test/x:v1"}`,
		`{"pod_uid":"","image":"x"}`, `{"pod_uid":"u"}`, `{}`, `null`, ``, `{"pod_uid":1}`, `{"pod_uid":"u","image":"x"}{}`,
		`{"pod_uid":"\u00ff","image":"\xff"}`,
	} {
		f.Add([]byte(seed))
	}
	rec := &snapshotRecorder{}
	srv, err := nodeapi.NewServer(nodeapi.ServerConfig{Runtime: rec, Token: fuzzToken})
	if err != nil {
		f.Fatal(err)
	}
	h := srv.Handler()
	f.Fuzz(func(t *testing.T, body []byte) {
		rec.got = nil
		w := post(h, "/v1/snapshot", body)
		if w.Code != http.StatusOK {
			if len(rec.got) > 0 {
				t.Fatalf("body %q refused (%d) after reaching the runtime", body, w.Code)
			}
			wantRefused(t, body, w)
			return
		}
		if len(rec.got) != 1 || rec.got[0].PodUID == "" || rec.got[0].Image == "" {
			t.Fatalf("body %q: runtime got %+v", body, rec.got)
		}
		if ct := w.Header().Get("Content-Type"); ct != "application/x-ndjson" ||
			!strings.Contains(w.Body.String(), `"progress":{"phase":"done"}`) || !strings.Contains(w.Body.String(), `"result":`) {
			t.Fatalf("body %q: answer %s %q", body, ct, w.Body)
		}
	})
}

package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/internal/depstest"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/vk/api"
)

// TestWireNames: the JSON names are the contract between sandman-vk and
// sandmanctl of other versions; this pins them.
func TestWireNames(t *testing.T) {
	at := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name string
		v    any
		want string
	}{
		{"images request", api.ImagesRequest{Images: []string{"busybox"}}, `{"images":["busybox"]}`},
		{"pre-pull line", api.PrePullLine{Time: at, Done: true, Ready: true, Nodes: []api.NodeImage{
			{Node: "w1", NodeError: "down"},
			{Node: "w2", ImageStatus: runtime.ImageStatus{Image: "docker.io/library/busybox:latest", State: runtime.ImageReady}},
		}}, `{"time":"2025-01-02T03:04:05Z","nodes":[` +
			`{"node":"w1","image":"","state":"","node_error":"down"},` +
			`{"node":"w2","image":"docker.io/library/busybox:latest","state":"ready"}],"done":true,"ready":true}`},
		{"capacity", api.Capacity{Time: at, Pool: "p", VirtualNode: "sandman-p", Queue: 2, QueueRoom: 100, AdvertisedPods: 104,
			Pods: map[string]int{"Running": 1},
			Totals: api.CapacityTotals{Nodes: 1, HealthyNodes: 1, CapacitySlots: 4, Slots: map[runtime.SlotState]int{runtime.StateWarm: 3},
				CPU: api.Amount{Allocated: 1, Capacity: 4}, Memory: api.Amount{Allocated: 2, Capacity: 8}, Inflight: 1},
			Nodes: []api.NodeCapacity{{Name: "w1", Healthy: true, Error: "e", CapacitySlots: 4, Slots: map[runtime.SlotState]int{runtime.StateBound: 1},
				CPU: api.Amount{}, Memory: api.Amount{}, ImageCount: 1, Images: []string{"i"}, Inflight: 1,
				Binds: 5, BindFailures: 1, BindP50MS: 2, BindP99MS: 3}},
			CreateToReady: api.ReadyHistogram{Window: "5m", Count: 1, P50MS: 4, P99MS: 5, Buckets: []api.Bucket{{LeMS: 25, Count: 1}}},
		}, `{"time":"2025-01-02T03:04:05Z","pool":"p","virtual_node":"sandman-p",` +
			`"totals":{"nodes":1,"healthy_nodes":1,"capacity_slots":4,"slots":{"warm":3},` +
			`"cpu_cores":{"allocated":1,"capacity":4},"memory_bytes":{"allocated":2,"capacity":8},"binds_in_flight":1},` +
			`"queue":2,"queue_room":100,"advertised_pods":104,"pods":{"Running":1},` +
			`"nodes":[{"name":"w1","healthy":true,"error":"e","capacity_slots":4,"slots":{"bound":1},` +
			`"cpu_cores":{"allocated":0,"capacity":0},"memory_bytes":{"allocated":0,"capacity":0},"image_count":1,"images":["i"],` +
			`"binds_in_flight":1,"binds":5,"bind_failures":1,"bind_p50_ms":2,"bind_p99_ms":3}],` +
			`"create_to_ready":{"window":"5m","count":1,"p50_ms":4,"p99_ms":5,"buckets":[{"le_ms":25,"count":1}]}}`},
		{"snapshot request", api.SnapshotRequest{Namespace: "ns", Pod: "p", Container: "c", Image: "envs/x:1"},
			`{"namespace":"ns","pod":"p","container":"c","image":"envs/x:1"}`},
		{"snapshot progress line", api.SnapshotLine{Time: at, Node: "w1", ElapsedMS: 1500,
			SnapshotProgress: runtime.SnapshotProgress{Phase: runtime.SnapshotPush, BytesDone: 1, BytesTotal: 2}},
			`{"time":"2025-01-02T03:04:05Z","node":"w1","phase":"push","bytes_done":1,"bytes_total":2,"elapsed_ms":1500}`},
		{"snapshot result line", api.SnapshotLine{Time: at, Node: "w1", ElapsedMS: 2000,
			SnapshotProgress: runtime.SnapshotProgress{Phase: runtime.SnapshotDone},
			Result: &runtime.SnapshotResult{Image: "r/x:1", Digest: "sha256:d", BaseImage: "b", Layer: "sha256:l",
				LayerBytes: 3, DiffBytes: 4, Frozen: 5, Duration: 6}},
			`{"time":"2025-01-02T03:04:05Z","node":"w1","phase":"done","elapsed_ms":2000,"result":{"image":"r/x:1","digest":"sha256:d",` +
				`"base_image":"b","layer":"sha256:l","layer_bytes":3,"diff_bytes":4,"frozen_ns":5,"duration_ns":6}}`},
		{"snapshot error line", api.SnapshotLine{Time: at, Node: "w1", SnapshotProgress: runtime.SnapshotProgress{Phase: runtime.SnapshotPush},
			Code: api.CodePermissionDenied, Error: "denied"},
			`{"time":"2025-01-02T03:04:05Z","node":"w1","phase":"push","elapsed_ms":0,"code":"permission_denied","error":"denied"}`},
		{"snapshot record", []api.SnapshotRecord{{Image: "r/x:1", Digest: "sha256:d", Time: at}},
			`[{"image":"r/x:1","digest":"sha256:d","time":"2025-01-02T03:04:05Z"}]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := json.Marshal(tc.v)
			if err != nil {
				t.Fatal(err)
			}
			if string(got) != tc.want {
				t.Errorf("got  %s\nwant %s", got, tc.want)
			}
		})
	}
}

// TestDependsOnLittle: a client of the virtual node's API links only the
// standard library and sandman's runtime types through this package.
func TestDependsOnLittle(t *testing.T) {
	allowed := map[string]bool{
		"github.com/sandman-dev/sandman/vk/api":      true,
		"github.com/sandman-dev/sandman/runtime":     true,
		"github.com/sandman-dev/sandman/podcontract": true,
		// runtime's own small dependencies.
		"github.com/containerd/errdefs":       true,
		"github.com/distribution/reference":   true,
		"github.com/opencontainers/go-digest": true,
	}
	for _, pkg := range depstest.NonStandard(t) {
		if !allowed[pkg] {
			t.Errorf("vk/api depends on %s", pkg)
		}
	}
}

// TestErrorCodes: every code is a class errors.Is finds, and a refusal's
// HTTP status reads back as the same code where the status is the code's
// own (a registry's refusal reads as unavailable).
func TestErrorCodes(t *testing.T) {
	for _, tc := range []struct {
		err   error
		code  string
		class error
	}{
		{fmt.Errorf("x: %w", errdefs.ErrNotFound), api.CodeNotFound, errdefs.ErrNotFound},
		{fmt.Errorf("x: %w", errdefs.ErrFailedPrecondition), api.CodeFailedPrecondition, errdefs.ErrFailedPrecondition},
		{fmt.Errorf("x: %w", errdefs.ErrInvalidArgument), api.CodeInvalidArgument, errdefs.ErrInvalidArgument},
		{fmt.Errorf("x: %w", errdefs.ErrNotImplemented), api.CodeNotImplemented, errdefs.ErrNotImplemented},
		{fmt.Errorf("x: %w", errdefs.ErrUnavailable), api.CodeUnavailable, errdefs.ErrUnavailable},
		{fmt.Errorf("x: %w", errdefs.ErrResourceExhausted), api.CodeResourceExhausted, errdefs.ErrResourceExhausted},
		{fmt.Errorf("x: %w", errdefs.ErrUnauthenticated), api.CodeUnauthenticated, errdefs.ErrUnauthenticated},
		{fmt.Errorf("x: %w", errdefs.ErrPermissionDenied), api.CodePermissionDenied, errdefs.ErrPermissionDenied},
		{fmt.Errorf("x: %w", context.Canceled), api.CodeCanceled, context.Canceled},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), api.CodeDeadlineExceeded, context.DeadlineExceeded},
		{errors.New("x"), api.CodeInternal, errdefs.ErrInternal},
	} {
		t.Run(tc.code, func(t *testing.T) {
			if got := api.ErrorCode(tc.err); got != tc.code {
				t.Fatalf("ErrorCode = %s", got)
			}
			e := &api.Error{Code: tc.code, Message: "m"}
			if !errors.Is(e, tc.class) || e.Error() != "m" {
				t.Fatalf("%v is not %v", e, tc.class)
			}
			back := api.CodeOfStatus(api.HTTPStatus(tc.code))
			switch tc.code {
			case api.CodeUnauthenticated, api.CodePermissionDenied:
				if back != api.CodeUnavailable {
					t.Fatalf("a registry's refusal reads back as %s", back)
				}
			case api.CodeCanceled:
			default:
				if back != tc.code {
					t.Fatalf("HTTP %d reads back as %s", api.HTTPStatus(tc.code), back)
				}
			}
		})
	}
}

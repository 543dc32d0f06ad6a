package api_test

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

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
				CPU: api.Amount{}, Memory: api.Amount{}, Images: []string{"i"}, Inflight: 1,
				Binds: 5, BindFailures: 1, BindP50MS: 2, BindP99MS: 3}},
			CreateToReady: api.ReadyHistogram{Window: "5m", Count: 1, P50MS: 4, P99MS: 5, Buckets: []api.Bucket{{LeMS: 25, Count: 1}}},
		}, `{"time":"2025-01-02T03:04:05Z","pool":"p","virtual_node":"sandman-p",` +
			`"totals":{"nodes":1,"healthy_nodes":1,"capacity_slots":4,"slots":{"warm":3},` +
			`"cpu_cores":{"allocated":1,"capacity":4},"memory_bytes":{"allocated":2,"capacity":8},"binds_in_flight":1},` +
			`"queue":2,"queue_room":100,"advertised_pods":104,"pods":{"Running":1},` +
			`"nodes":[{"name":"w1","healthy":true,"error":"e","capacity_slots":4,"slots":{"bound":1},` +
			`"cpu_cores":{"allocated":0,"capacity":0},"memory_bytes":{"allocated":0,"capacity":0},"images":["i"],` +
			`"binds_in_flight":1,"binds":5,"bind_failures":1,"bind_p50_ms":2,"bind_p99_ms":3}],` +
			`"create_to_ready":{"window":"5m","count":1,"p50_ms":4,"p99_ms":5,"buckets":[{"le_ms":25,"count":1}]}}`},
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
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command in PATH to list the package's dependencies")
	}
	out, err := exec.Command(goTool, "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	allowed := map[string]bool{
		"github.com/sandman-dev/sandman/vk/api":  true,
		"github.com/sandman-dev/sandman/runtime": true,
		// runtime's own small dependencies.
		"github.com/containerd/errdefs":       true,
		"github.com/distribution/reference":   true,
		"github.com/opencontainers/go-digest": true,
	}
	for _, pkg := range strings.Fields(string(out)) {
		if !allowed[pkg] {
			t.Errorf("vk/api depends on %s", pkg)
		}
	}
}

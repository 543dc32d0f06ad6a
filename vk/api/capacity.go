package api

import (
	"time"

	"github.com/sandman-dev/sandman/runtime"
)

// Capacity is what the capacity page, `sandmanctl top nodes` and
// GET APIPrefix+"capacity" show: every worker node and the pool's totals.
type Capacity struct {
	Time        time.Time `json:"time"`
	Pool        string    `json:"pool"`
	VirtualNode string    `json:"virtual_node"`
	// Totals count healthy nodes only: an unhealthy node's capacity leaves
	// them.
	Totals CapacityTotals `json:"totals"`
	// Queue is the admission queue's depth.
	Queue int `json:"queue"`
	// QueueRoom is the room for queued pods the virtual node advertises
	// beyond its slots (0: it advertises its slots only), and
	// AdvertisedPods the pods capacity kube-scheduler sees: slots + room.
	QueueRoom      int   `json:"queue_room"`
	AdvertisedPods int64 `json:"advertised_pods"`
	// Pods counts the virtual node's pods by phase; the keys are Kubernetes
	// pod phases (corev1.PodPhase values: Pending, Running, Succeeded,
	// Failed).
	Pods  map[string]int `json:"pods"`
	Nodes []NodeCapacity `json:"nodes"`
	// CreateToReady covers sandboxes Ready within the last window.
	CreateToReady ReadyHistogram `json:"create_to_ready"`
}

// CapacityTotals sum the healthy nodes.
type CapacityTotals struct {
	Nodes         int                       `json:"nodes"`
	HealthyNodes  int                       `json:"healthy_nodes"`
	CapacitySlots int                       `json:"capacity_slots"`
	Slots         map[runtime.SlotState]int `json:"slots"`
	CPU           Amount                    `json:"cpu_cores"`
	Memory        Amount                    `json:"memory_bytes"`
	Inflight      int                       `json:"binds_in_flight"`
}

// Amount is allocated out of capacity.
type Amount struct {
	Allocated float64 `json:"allocated"`
	Capacity  float64 `json:"capacity"`
}

// NodeCapacity is one worker node.
type NodeCapacity struct {
	Name          string                    `json:"name"`
	Healthy       bool                      `json:"healthy"`
	Error         string                    `json:"error,omitempty"`
	CapacitySlots int                       `json:"capacity_slots"`
	Slots         map[runtime.SlotState]int `json:"slots"`
	CPU           Amount                    `json:"cpu_cores"`
	Memory        Amount                    `json:"memory_bytes"`
	// ImageCount is how many images the node has cached. Images names
	// them (references with digests: private registry paths, snapshots,
	// templates) only for a caller the kubelet port authorized (GET
	// APIPrefix+"capacity", and the page there); the metrics listener's
	// page, which anyone who reaches the port can read, counts them only.
	ImageCount int      `json:"image_count"`
	Images     []string `json:"images,omitempty"`
	Inflight   int      `json:"binds_in_flight"`
	// Binds over the pool's recent window (pool.BindWindow): count,
	// failures, latency of the successful ones.
	Binds        int     `json:"binds"`
	BindFailures int     `json:"bind_failures"`
	BindP50MS    float64 `json:"bind_p50_ms"`
	BindP99MS    float64 `json:"bind_p99_ms"`
}

// ReadyHistogram is a create→Ready distribution over Window (a Go duration
// such as "5m").
type ReadyHistogram struct {
	Window  string   `json:"window"`
	Count   int      `json:"count"`
	P50MS   float64  `json:"p50_ms"`
	P99MS   float64  `json:"p99_ms"`
	Buckets []Bucket `json:"buckets"`
}

// Bucket counts samples at most LeMS (and above the previous bucket); the
// last bucket (LeMS 0) holds the rest.
type Bucket struct {
	LeMS  float64 `json:"le_ms"`
	Count int     `json:"count"`
}

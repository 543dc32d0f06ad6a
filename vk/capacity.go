package vk

import (
	_ "embed"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sandman-dev/sandman/pool"
	"github.com/sandman-dev/sandman/runtime"
)

//go:embed capacity.html
var capacityPage []byte

// Capacity is what the capacity page, `sandmanctl top nodes` and
// GET /sandman/v1/capacity show: every worker node and the pool's totals.
type Capacity struct {
	Time        time.Time `json:"time"`
	Pool        string    `json:"pool"`
	VirtualNode string    `json:"virtual_node"`
	// Totals count healthy nodes only: an unhealthy node's capacity leaves
	// them.
	Totals CapacityTotals `json:"totals"`
	// Queue is the admission queue's depth.
	Queue int `json:"queue"`
	// Pods by phase on the virtual node.
	Pods  map[corev1.PodPhase]int `json:"pods"`
	Nodes []NodeCapacity          `json:"nodes"`
	// CreateToReady covers sandboxes Ready within the last Window.
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
	Images        []string                  `json:"images"`
	Inflight      int                       `json:"binds_in_flight"`
	// Binds over the last pool.BindWindow: count, failures, latency of the
	// successful ones.
	Binds        int     `json:"binds"`
	BindFailures int     `json:"bind_failures"`
	BindP50MS    float64 `json:"bind_p50_ms"`
	BindP99MS    float64 `json:"bind_p99_ms"`
}

// ReadyHistogram is a create→Ready distribution.
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

var readyBucketsMS = []float64{25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000}

// Capacity returns the current snapshot.
func (p *Provider) Capacity() Capacity {
	now := p.cfg.Now()
	c := Capacity{Time: now, Pool: p.cfg.Pool.Name(), VirtualNode: p.cfg.NodeName, Queue: p.cfg.Pool.QueueLen(),
		Pods: p.podsByPhase(), Totals: CapacityTotals{Slots: map[runtime.SlotState]int{}}}
	for _, v := range p.cfg.Pool.Nodes() {
		n := NodeCapacity{Name: v.Name, Healthy: v.Healthy, Error: v.Error, CapacitySlots: v.Capacity.Slots,
			Slots: map[runtime.SlotState]int{}, Images: v.Images, Inflight: v.Inflight,
			CPU:    Amount{float64(v.Allocated.MilliCPU) / 1000, float64(v.Capacity.Resources.MilliCPU) / 1000},
			Memory: Amount{float64(v.Allocated.MemoryBytes), float64(v.Capacity.Resources.MemoryBytes)},
			Binds:  v.Binds.Count, BindFailures: v.Binds.Failed,
			BindP50MS: ms(v.Binds.P50), BindP99MS: ms(v.Binds.P99)}
		if n.Images == nil {
			n.Images = []string{}
		}
		for _, st := range runtime.SlotStates {
			n.Slots[st] = v.Slots[st]
		}
		c.Nodes = append(c.Nodes, n)
		c.Totals.Nodes++
		if !v.Healthy {
			continue
		}
		c.Totals.HealthyNodes++
		c.Totals.CapacitySlots += n.CapacitySlots
		for st, k := range n.Slots {
			c.Totals.Slots[st] += k
		}
		c.Totals.CPU.Allocated += n.CPU.Allocated
		c.Totals.CPU.Capacity += n.CPU.Capacity
		c.Totals.Memory.Allocated += n.Memory.Allocated
		c.Totals.Memory.Capacity += n.Memory.Capacity
		c.Totals.Inflight += n.Inflight
	}
	for _, st := range runtime.SlotStates {
		c.Totals.Slots[st] += 0
	}
	c.CreateToReady = p.recentReady.histogram(now)
	return c
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func (p *Provider) podsByPhase() map[corev1.PodPhase]int {
	out := map[corev1.PodPhase]int{corev1.PodPending: 0, corev1.PodRunning: 0, corev1.PodSucceeded: 0, corev1.PodFailed: 0}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, sb := range p.byUID {
		out[sb.phase()]++
	}
	return out
}

// AttachCapacity serves the capacity page at /capacity and its data at
// /capacity.json (the page fetches it relative to its own address, so it
// works through `kubectl proxy` and the apiserver's node proxy too).
func (p *Provider) AttachCapacity(mux *http.ServeMux) {
	mux.HandleFunc("GET /capacity", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(capacityPage)
	})
	mux.HandleFunc("GET /capacity.json", p.serveCapacity)
}

func (p *Provider) serveCapacity(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(p.Capacity())
}

// readyRingSize bounds the create→Ready samples kept.
const readyRingSize = 20000

// readyRing keeps recent create→Ready durations.
type readyRing struct {
	mu   sync.Mutex
	at   []time.Time
	took []time.Duration
	next int
}

func (r *readyRing) add(at time.Time, took time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.at) < readyRingSize {
		r.at, r.took = append(r.at, at), append(r.took, took)
		return
	}
	r.at[r.next], r.took[r.next] = at, took
	r.next = (r.next + 1) % readyRingSize
}

func (r *readyRing) histogram(now time.Time) ReadyHistogram {
	r.mu.Lock()
	var recent []time.Duration
	for i, at := range r.at {
		if now.Sub(at) <= pool.BindWindow {
			recent = append(recent, r.took[i])
		}
	}
	r.mu.Unlock()
	h := ReadyHistogram{Window: strings.TrimSuffix(pool.BindWindow.String(), "0s"), Count: len(recent)}
	for _, le := range readyBucketsMS {
		h.Buckets = append(h.Buckets, Bucket{LeMS: le})
	}
	h.Buckets = append(h.Buckets, Bucket{})
	if len(recent) == 0 {
		return h
	}
	slices.Sort(recent)
	h.P50MS, h.P99MS = ms(recent[(len(recent)-1)/2]), ms(recent[(len(recent)-1)*99/100])
	for _, d := range recent {
		i, _ := slices.BinarySearch(readyBucketsMS, ms(d))
		h.Buckets[i].Count++
	}
	return h
}

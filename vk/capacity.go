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
	vkapi "github.com/sandman-dev/sandman/vk/api"
)

//go:embed capacity.html
var capacityPage []byte

var readyBucketsMS = []float64{25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000}

// Capacity returns the current snapshot as anyone may read it: counts and
// sizes, each node's images counted but not named.
func (p *Provider) Capacity() vkapi.Capacity { return p.capacity(false) }

// capacity is Capacity, each node's image references in it with images
// (for a caller the kubelet port authorized).
func (p *Provider) capacity(images bool) vkapi.Capacity {
	now := p.cfg.Now()
	c := vkapi.Capacity{Time: now, Pool: p.cfg.Pool.Name(), VirtualNode: p.cfg.NodeName, Queue: p.cfg.Pool.QueueLen(),
		Pods: map[string]int{}, Totals: vkapi.CapacityTotals{Slots: map[runtime.SlotState]int{}}}
	for ph, k := range p.podsByPhase() {
		c.Pods[string(ph)] = k
	}
	for _, v := range p.cfg.Pool.Nodes() {
		n := vkapi.NodeCapacity{Name: v.Name, Healthy: v.Healthy, Error: v.Error, CapacitySlots: v.Capacity.Slots,
			Slots: map[runtime.SlotState]int{}, ImageCount: len(v.Images), Inflight: v.Inflight,
			CPU: vkapi.Amount{Allocated: float64(v.Allocated.MilliCPU) / 1000,
				Capacity: float64(v.Capacity.Resources.MilliCPU) / 1000},
			Memory: vkapi.Amount{Allocated: float64(v.Allocated.MemoryBytes),
				Capacity: float64(v.Capacity.Resources.MemoryBytes)},
			Binds: v.Binds.Count, BindFailures: v.Binds.Failed,
			BindP50MS: ms(v.Binds.P50), BindP99MS: ms(v.Binds.P99)}
		if images {
			n.Images = v.Images
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
	c.QueueRoom = p.cfg.QueueRoom
	c.AdvertisedPods, _, _ = Advertised(runtime.Capacity{Slots: c.Totals.CapacitySlots}, p.cfg.QueueRoom)
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
// works through `kubectl proxy` and the apiserver's node proxy too) on a
// listener that authenticates no one (the metrics port): the data counts
// each node's images but does not name them. AttachAPI serves the same
// routes, naming them, on the kubelet port.
func (p *Provider) AttachCapacity(mux *http.ServeMux) { p.attachCapacity(mux, false) }

func (p *Provider) attachCapacity(mux *http.ServeMux, images bool) {
	mux.HandleFunc("GET /capacity", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		_, _ = w.Write(capacityPage)
	})
	mux.HandleFunc("GET /capacity.json", p.serveCapacity(images))
}

// serveCapacity answers the capacity snapshot, with image references when
// images is set.
func (p *Provider) serveCapacity(images bool) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		_ = json.NewEncoder(w).Encode(p.capacity(images))
	}
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

func (r *readyRing) histogram(now time.Time) vkapi.ReadyHistogram {
	r.mu.Lock()
	var recent []time.Duration
	for i, at := range r.at {
		if now.Sub(at) <= pool.BindWindow {
			recent = append(recent, r.took[i])
		}
	}
	r.mu.Unlock()
	h := vkapi.ReadyHistogram{Window: strings.TrimSuffix(pool.BindWindow.String(), "0s"), Count: len(recent)}
	for _, le := range readyBucketsMS {
		h.Buckets = append(h.Buckets, vkapi.Bucket{LeMS: le})
	}
	h.Buckets = append(h.Buckets, vkapi.Bucket{})
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

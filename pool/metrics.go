package pool

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandman-dev/sandman/runtime"
)

var (
	metricBindSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sandman_pool_bind_seconds",
		Help:    "Duration of bind calls from the virtual node to node agents, in seconds, by node and outcome.",
		Buckets: prometheus.ExponentialBuckets(0.002, 2, 14),
	}, []string{"node", "outcome"})
	metricAdmissionWait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sandman_pool_admission_wait_seconds",
		Help:    "Time pods waited in the admission queue before a node was chosen, in seconds.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 20),
	})
	metricPlacements = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sandman_pool_placements_total",
		Help: "Placement decisions by outcome: hot (a hot slot of the image), image (the image on the node), cold, waiting (no node could take the pod when it arrived).",
	}, []string{"outcome"})
	metricCheckpoints = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sandman_pool_checkpoints_total",
		Help: "Pauses and resumes of sandboxes asked of node agents, by node, op (pause, resume) and outcome (ok, or the error's class).",
	}, []string{"node", "op", "outcome"})
	metricSnapshots = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sandman_pool_snapshots_total",
		Help: "Snapshots of bound sandboxes asked of node agents, by node and outcome (ok, or the error's class: not_found, failed_precondition, invalid_argument, registry_refused, unavailable, resource_exhausted, canceled, deadline_exceeded, error).",
	}, []string{"node", "outcome"})
	metricSnapshotSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sandman_pool_snapshot_seconds",
		Help:    "Duration of snapshot calls to node agents (freeze, diff, commit, push), in seconds, by outcome.",
		Buckets: prometheus.ExponentialBuckets(0.05, 2, 14),
	}, []string{"outcome"})
	metricSnapshotFrozenSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sandman_pool_snapshot_frozen_seconds",
		Help:    "How long successful snapshots kept their sandbox paused, in seconds.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
	})
)

func init() {
	// Every outcome exists from the start, so dashboards show zeros, not gaps.
	for _, o := range []string{"hot", "image", "cold", "waiting"} {
		metricPlacements.WithLabelValues(o)
	}
}

// Collectors are the pool's package-level metrics, for registration by cmd.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{metricBindSeconds, metricAdmissionWait, metricPlacements,
		metricSnapshots, metricSnapshotSeconds, metricSnapshotFrozenSeconds, metricCheckpoints}
}

// Collector reports the pool's state at scrape time, one series per worker
// node: slots by state, capacity and allocation, health, images, binds in
// flight, bind latency over BindWindow; the admission queue's depth; and
// per namespace with pods queued or placed (never per job: a pod names its
// job), its queued pods, placements and weight.
func (p *Pool) Collector() prometheus.Collector { return poolCollector{p} }

type poolCollector struct{ p *Pool }

var (
	nodeLabels      = []string{"node"}
	descQueue       = prometheus.NewDesc("sandman_pool_queue_depth", "Pods waiting in the admission queue.", nil, nil)
	nsLabels        = []string{"namespace"}
	descNSQueue     = prometheus.NewDesc("sandman_pool_namespace_queue_depth", "Pods of the namespace waiting in the admission queue (namespaces with pods queued or placed).", nsLabels, nil)
	descNSHeld      = prometheus.NewDesc("sandman_pool_namespace_placements", "Pods of the namespace binding or bound: what its fair share is measured by.", nsLabels, nil)
	descNSWeight    = prometheus.NewDesc("sandman_pool_namespace_weight", "The namespace's weight in the admission queue's fair share (1 unless the operator set one).", nsLabels, nil)
	descNodeHealthy = prometheus.NewDesc("sandman_pool_node_healthy", "1 when the node agent's watch stream is up, else 0.", nodeLabels, nil)
	descNodeSlots   = prometheus.NewDesc("sandman_pool_node_slots", "Slots of the node by state (warm, hot, binding, bound, releasing, broken), as the pool sees them.", []string{"node", "state"}, nil)
	descNodeCapSl   = prometheus.NewDesc("sandman_pool_node_capacity_slots", "Slot capacity of the node (0 while unhealthy: it leaves the totals).", nodeLabels, nil)
	descNodeCapCPU  = prometheus.NewDesc("sandman_pool_node_capacity_cpu_cores", "CPU the node offers sandboxes, in cores (0 while unhealthy).", nodeLabels, nil)
	descNodeCapMem  = prometheus.NewDesc("sandman_pool_node_capacity_memory_bytes", "Memory the node offers sandboxes, in bytes (0 while unhealthy).", nodeLabels, nil)
	descNodeAlCPU   = prometheus.NewDesc("sandman_pool_node_allocated_cpu_cores", "CPU requested by pods bound or binding on the node, in cores.", nodeLabels, nil)
	descNodeAlMem   = prometheus.NewDesc("sandman_pool_node_allocated_memory_bytes", "Memory requested by pods bound or binding on the node, in bytes.", nodeLabels, nil)
	descNodeImages  = prometheus.NewDesc("sandman_pool_node_images_ready", "Images ready on the node.", nodeLabels, nil)
	descNodeFlight  = prometheus.NewDesc("sandman_pool_node_binds_in_flight", "Bind calls to the node not yet returned.", nodeLabels, nil)
	descNodeUnseen  = prometheus.NewDesc("sandman_pool_node_sandboxes_unseen", "Sandboxes last seen bound on the node while its agent does not answer: they may still run on the worker (released when the agent returns; otherwise drain or uninstall it there).", nodeLabels, nil)
	descNodeDrain   = prometheus.NewDesc("sandman_pool_node_draining", "1 while the node agent drains (its worker cordoned): it takes no binds.", nodeLabels, nil)
	descNodeBindQ   = prometheus.NewDesc("sandman_pool_node_bind_recent_seconds", "Bind call latency to the node over the last 5 minutes (successful binds), by quantile, in seconds.", []string{"node", "quantile"}, nil)
)

func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descQueue, descNSQueue, descNSHeld, descNSWeight, descNodeHealthy, descNodeSlots, descNodeCapSl, descNodeCapCPU, descNodeCapMem,
		descNodeAlCPU, descNodeAlMem, descNodeImages, descNodeFlight, descNodeBindQ, descNodeUnseen, descNodeDrain} {
		ch <- d
	}
}

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(descQueue, float64(c.p.QueueLen()))
	for _, s := range c.p.Shares() {
		gauge(descNSQueue, float64(s.Queued), s.Namespace)
		gauge(descNSHeld, float64(s.Held), s.Namespace)
		gauge(descNSWeight, float64(s.Weight), s.Namespace)
	}
	for _, v := range c.p.Nodes() {
		healthy, capa := 0.0, v.Capacity
		if v.Healthy {
			healthy = 1
		} else {
			capa = runtime.Capacity{}
		}
		gauge(descNodeHealthy, healthy, v.Name)
		for _, st := range runtime.SlotStates {
			gauge(descNodeSlots, float64(v.Slots[st]), v.Name, string(st))
		}
		gauge(descNodeCapSl, float64(capa.Slots), v.Name)
		gauge(descNodeCapCPU, float64(capa.Resources.MilliCPU)/1000, v.Name)
		gauge(descNodeCapMem, float64(capa.Resources.MemoryBytes), v.Name)
		gauge(descNodeAlCPU, float64(v.Allocated.MilliCPU)/1000, v.Name)
		gauge(descNodeAlMem, float64(v.Allocated.MemoryBytes), v.Name)
		gauge(descNodeImages, float64(len(v.Images)), v.Name)
		gauge(descNodeFlight, float64(v.Inflight), v.Name)
		gauge(descNodeUnseen, float64(v.Unseen), v.Name)
		draining := 0.0
		if v.Draining != "" {
			draining = 1
		}
		gauge(descNodeDrain, draining, v.Name)
		gauge(descNodeBindQ, v.Binds.P50.Seconds(), v.Name, "0.5")
		gauge(descNodeBindQ, v.Binds.P99.Seconds(), v.Name, "0.99")
	}
}

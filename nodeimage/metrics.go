package nodeimage

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the node's image metrics; every series carries the node label.
type metrics struct {
	pulls       *prometheus.CounterVec
	pullSeconds prometheus.Histogram
	pullBytes   prometheus.Counter
	gcRemoved   prometheus.Counter
	// accessChecks are registry checks of credentials for private images.
	accessChecks *prometheus.CounterVec
	// conversions are eStargz conversions this node made for its pool.
	conversions *prometheus.CounterVec
}

func newMetrics(node string) *metrics {
	l := prometheus.Labels{"node": node}
	m := &metrics{
		pulls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandman_node_image_pulls_total", ConstLabels: l,
			Help: "Image pulls by result: ok, not_found, unauthorized, unreachable, runtime_unavailable, disk_full, invalid, failed.",
		}, []string{"result"}),
		pullSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "sandman_node_image_pull_duration_seconds", ConstLabels: l,
			Buckets: []float64{.1, .25, .5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600},
			Help:    "Time to pull and unpack an image, retries included, for successful pulls (seconds).",
		}),
		pullBytes: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandman_node_image_pulled_bytes_total", ConstLabels: l,
			Help: "Compressed bytes of images pulled successfully that are in containerd's content store after the pull: fetched eagerly (or there before). Layers mounted lazily do not count: see sandman_node_image_lazy_fetched_bytes.",
		}),
		gcRemoved: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandman_node_image_gc_removed_total", ConstLabels: l,
			Help: "Images removed to keep the cache within its budget.",
		}),
		accessChecks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandman_node_image_access_checks_total", ConstLabels: l,
			Help: "Registry checks (manifest HEAD) of whether credentials may read an image on the node, by result: allowed, refused, failed (no answer). Answers kept from earlier checks do not count.",
		}, []string{"result"}),
		conversions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandman_node_image_conversions_total", ConstLabels: l,
			Help: "eStargz conversions of images pulled whole, pushed to the pool's convert repository for lazy pulls elsewhere, by result: ok, failed, skipped (layers already eStargz), private (not served anonymously as the digest pulled, or a tenant's).",
		}, []string{"result"}),
	}
	for _, r := range []string{"ok", "failed", "skipped", "private"} {
		m.conversions.WithLabelValues(r)
	}
	for _, r := range []string{"allowed", "refused", "failed"} {
		m.accessChecks.WithLabelValues(r)
	}
	// Every result exists from the start, so dashboards show zeros, not gaps.
	for _, r := range []Kind{"ok", KindNotFound, KindUnauthorized, KindUnreachable, KindRuntimeUnavailable, KindDiskFull, KindInvalid, KindFailed} {
		m.pulls.WithLabelValues(string(r))
	}
	return m
}

var (
	cachedDesc = prometheus.NewDesc("sandman_node_images_cached",
		"Images unpacked on the node.", []string{"node"}, nil)
	cacheBytesDesc = prometheus.NewDesc("sandman_node_image_cache_bytes",
		"Disk used by cached images, content and unpacked layers (bytes; images not measured yet count 0).", []string{"node"}, nil)
	budgetDesc = prometheus.NewDesc("sandman_node_image_cache_budget_bytes",
		"The image cache's disk budget (bytes; 0: none).", []string{"node"}, nil)
	lazyCacheDesc = prometheus.NewDesc("sandman_node_image_lazy_cache_bytes",
		"Disk used by the lazy-pulling snapshotter's cache of what sandboxes read from lazily pulled layers, as the last image GC measured it (bytes; part of sandman_node_image_cache_bytes).", []string{"node"}, nil)
	lazyImagesDesc = prometheus.NewDesc("sandman_node_images_lazy",
		"Images on the node with layers mounted lazily (part of sandman_node_images_cached).", []string{"node"}, nil)
	pullingDesc = prometheus.NewDesc("sandman_node_image_pulls_in_flight",
		"Image pulls in progress.", []string{"node"}, nil)
)

// Collector returns the image metrics for a Prometheus registry.
func (m *Manager) Collector() prometheus.Collector { return &collector{m: m} }

type collector struct{ m *Manager }

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{cachedDesc, cacheBytesDesc, budgetDesc, pullingDesc, lazyCacheDesc, lazyImagesDesc} {
		ch <- d
	}
	c.m.metrics.pulls.Describe(ch)
	c.m.metrics.pullSeconds.Describe(ch)
	c.m.metrics.pullBytes.Describe(ch)
	c.m.metrics.gcRemoved.Describe(ch)
	c.m.metrics.accessChecks.Describe(ch)
	c.m.metrics.conversions.Describe(ch)
	if c.m.cfg.LazyMetricsURL != "" {
		for _, d := range []*prometheus.Desc{lazyUpDesc, lazyFetchedDesc, lazyServedDesc, lazyFetchDesc, lazyMountDesc} {
			ch <- d
		}
	}
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	m := c.m
	u := m.Usage(context.Background())
	node := m.cfg.Node
	ch <- prometheus.MustNewConstMetric(cachedDesc, prometheus.GaugeValue, float64(u.Images), node)
	ch <- prometheus.MustNewConstMetric(cacheBytesDesc, prometheus.GaugeValue, float64(u.Bytes), node)
	ch <- prometheus.MustNewConstMetric(budgetDesc, prometheus.GaugeValue, float64(m.cfg.CacheBytes), node)
	ch <- prometheus.MustNewConstMetric(pullingDesc, prometheus.GaugeValue, float64(u.Pulling), node)
	ch <- prometheus.MustNewConstMetric(lazyCacheDesc, prometheus.GaugeValue, float64(u.LazyBytes), node)
	ch <- prometheus.MustNewConstMetric(lazyImagesDesc, prometheus.GaugeValue, float64(u.LazyImages), node)
	m.metrics.pulls.Collect(ch)
	m.metrics.pullSeconds.Collect(ch)
	m.metrics.pullBytes.Collect(ch)
	m.metrics.gcRemoved.Collect(ch)
	m.metrics.accessChecks.Collect(ch)
	m.metrics.conversions.Collect(ch)
	if m.cfg.LazyMetricsURL != "" {
		m.collectLazy(ch)
	}
}

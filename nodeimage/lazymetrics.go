package nodeimage

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// What stargz-snapshotter's metrics endpoint says, per layer, that the
// node's image metrics sum up (its fs/metrics/common).
const (
	stargzBytes         = "stargz_fs_bytes_served"
	stargzLatency       = "stargz_fs_operation_duration_milliseconds"
	stargzFetched       = "on_demand_bytes_fetched"
	stargzServed        = "on_demand_bytes_served"
	stargzRegistryGet   = "remote_registry_get"
	stargzMount         = "mount"
	lazyScrapeTimeout   = 2 * time.Second
	millisecondsPerSecs = 1000
)

var (
	lazyUpDesc = prometheus.NewDesc("sandman_node_image_lazy_up",
		"Whether the lazy-pulling snapshotter's metrics answered (1) or not (0); absent when the node does not pull lazily.", []string{"node"}, nil)
	lazyFetchedDesc = prometheus.NewDesc("sandman_node_image_lazy_fetched_bytes",
		"Bytes the lazy-pulling snapshotter fetched from registries on demand, as sandboxes read files of lazily pulled layers, since it started (compressed; prefetches and background fetches not counted). Eager fetches are sandman_node_image_pulled_bytes_total.", []string{"node"}, nil)
	lazyServedDesc = prometheus.NewDesc("sandman_node_image_lazy_served_bytes",
		"Bytes of lazily pulled files sandboxes read through the snapshotter on demand since it started (uncompressed; from its cache or fetched).", []string{"node"}, nil)
	lazyFetchDesc = prometheus.NewDesc("sandman_node_image_lazy_fetch_duration_seconds",
		"Time of each registry fetch of the lazy-pulling snapshotter: what a sandbox's first read of an unfetched part of its image waits for (seconds).", []string{"node"}, nil)
	lazyMountDesc = prometheus.NewDesc("sandman_node_image_lazy_mount_duration_seconds",
		"Time to mount a lazily pulled layer, its table of contents and prioritized files fetched (seconds).", []string{"node"}, nil)
)

// collectLazy scrapes the snapshotter's metrics and sends the node's sums.
func (m *Manager) collectLazy(ch chan<- prometheus.Metric) {
	node := m.cfg.Node
	families, err := m.scrapeLazy()
	if err != nil {
		m.cfg.Logger.Debug("lazy-pulling snapshotter metrics", "url", m.cfg.LazyMetricsURL, "err", err)
		ch <- prometheus.MustNewConstMetric(lazyUpDesc, prometheus.GaugeValue, 0, node)
		return
	}
	ch <- prometheus.MustNewConstMetric(lazyUpDesc, prometheus.GaugeValue, 1, node)
	fetched, served := 0.0, 0.0
	if f := families[stargzBytes]; f != nil {
		for _, mt := range f.GetMetric() {
			switch label(mt, "operation_type") {
			case stargzFetched:
				fetched += mt.GetGauge().GetValue()
			case stargzServed:
				served += mt.GetGauge().GetValue()
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(lazyFetchedDesc, prometheus.GaugeValue, fetched, node)
	ch <- prometheus.MustNewConstMetric(lazyServedDesc, prometheus.GaugeValue, served, node)
	for op, desc := range map[string]*prometheus.Desc{stargzRegistryGet: lazyFetchDesc, stargzMount: lazyMountDesc} {
		count, sum, buckets := mergeHistograms(families[stargzLatency], op)
		ch <- prometheus.MustNewConstHistogram(desc, count, sum, buckets, node)
	}
}

func (m *Manager) scrapeLazy() (map[string]*dto.MetricFamily, error) {
	ctx, cancel := context.WithTimeout(context.Background(), lazyScrapeTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.cfg.LazyMetricsURL, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s", resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// mergeHistograms adds up the per-layer histograms of operation op (in
// milliseconds) into one in seconds.
func mergeHistograms(f *dto.MetricFamily, op string) (count uint64, sum float64, buckets map[float64]uint64) {
	buckets = map[float64]uint64{}
	if f == nil {
		return 0, 0, buckets
	}
	for _, mt := range f.GetMetric() {
		if label(mt, "operation_type") != op {
			continue
		}
		h := mt.GetHistogram()
		count += h.GetSampleCount()
		sum += h.GetSampleSum() / millisecondsPerSecs
		for _, b := range h.GetBucket() {
			if ub := b.GetUpperBound(); !math.IsInf(ub, 1) {
				buckets[ub/millisecondsPerSecs] += b.GetCumulativeCount()
			}
		}
	}
	return count, sum, buckets
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// lazyFetchedByLayer is what the snapshotter fetched on demand, by layer
// digest (nil when its metrics are not configured or do not answer).
func (m *Manager) lazyFetchedByLayer() map[string]int64 {
	if m.cfg.LazyMetricsURL == "" {
		return nil
	}
	families, err := m.scrapeLazy()
	if err != nil {
		return nil
	}
	out := map[string]int64{}
	if f := families[stargzBytes]; f != nil {
		for _, mt := range f.GetMetric() {
			if label(mt, "operation_type") == stargzFetched {
				out[label(mt, "layer")] += int64(mt.GetGauge().GetValue())
			}
		}
	}
	return out
}

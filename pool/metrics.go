package pool

import "github.com/prometheus/client_golang/prometheus"

var (
	metricBindSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "sandman_pool_bind_seconds",
		Help:    "Duration of bind calls from the virtual node to node agents, in seconds, by node and outcome.",
		Buckets: prometheus.ExponentialBuckets(0.002, 2, 14),
	}, []string{"node", "outcome"})
)

// Collectors are the pool's metrics, for registration by cmd.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{metricBindSeconds}
}

package sandboxdns

import "github.com/prometheus/client_golang/prometheus"

// Results of a query, the result label of sandman_node_dns_queries_total.
const (
	// resultPinned: an allowed A query answered, its addresses pinned.
	resultPinned = "pinned"
	// resultEmpty: an allowed AAAA, HTTPS or SVCB query answered with no
	// records.
	resultEmpty = "empty"
	// resultForwarded: an allowed query of another type, or one whose
	// answer had no address, forwarded as it was.
	resultForwarded = "forwarded"
	// resultRefused: a name the sandbox may not resolve.
	resultRefused = "refused"
	// resultUnknown: from an address no sandbox with names has.
	resultUnknown = "unknown_source"
	// resultFailed: the upstream servers did not answer, or the addresses
	// could not be pinned (answered SERVFAIL).
	resultFailed = "failed"
	// resultMalformed: not a query this server answers (FORMERR, NOTIMP,
	// or dropped when unreadable).
	resultMalformed = "malformed"
	// resultDropped: more queries in flight than Config.MaxInFlight.
	resultDropped = "dropped"
)

type metrics struct {
	queries *prometheus.CounterVec
}

func newMetrics() *metrics {
	m := &metrics{
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandman_node_dns_queries_total",
			Help: "DNS queries of sandboxes with allowed names, by result: pinned, empty, forwarded, refused, unknown_source, failed, malformed, dropped.",
		}, []string{"result"}),
	}
	for _, r := range []string{resultPinned, resultEmpty, resultForwarded, resultRefused, resultUnknown, resultFailed, resultMalformed, resultDropped} {
		m.queries.WithLabelValues(r)
	}
	return m
}

// Collector returns the server's metrics for a Prometheus registry.
func (s *Server) Collector() prometheus.Collector { return s.metrics.queries }

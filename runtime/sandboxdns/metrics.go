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
	// resultLimited: refused for a budget of the sandbox's
	// (sandman_node_dns_refused_total says which).
	resultLimited = "limited"
)

// Budgets a TCP connection was past when it was closed at once, the limit
// label of sandman_node_dns_tcp_rejected_total.
const (
	// limitSandbox: Config.MaxConnsPerSandbox.
	limitSandbox = "sandbox"
	// limitNode: Config.MaxConns.
	limitNode = "node"
)

// metrics are the server's; it is their prometheus.Collector.
type metrics struct {
	queries       *prometheus.CounterVec
	refused       *prometheus.CounterVec
	connsRejected *prometheus.CounterVec
	addrsDropped  prometheus.Counter
}

func newMetrics() *metrics {
	m := &metrics{
		queries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandman_node_dns_queries_total",
			Help: "DNS queries of sandboxes with allowed names, by result: pinned, empty, forwarded, refused, unknown_source, failed, malformed, dropped, limited.",
		}, []string{"result"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandman_node_dns_refused_total",
			Help: "DNS queries answered REFUSED because the sandbox asking was over a budget of its own, by reason: in_flight (queries being answered), rate (queries a second), pinned (addresses pinned).",
		}, []string{"reason"}),
		connsRejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sandman_node_dns_tcp_rejected_total",
			Help: "TCP connections to the sandbox DNS resolver closed on accepting them, by the budget of open connections they were past: sandbox or node.",
		}, []string{"limit"}),
		addrsDropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sandman_node_dns_answer_addresses_dropped_total",
			Help: "Addresses (A records) left out of answers to sandboxes, neither pinned nor answered, past the addresses one answer may pin.",
		}),
	}
	for _, r := range []string{resultPinned, resultEmpty, resultForwarded, resultRefused, resultUnknown, resultFailed, resultMalformed, resultDropped, resultLimited} {
		m.queries.WithLabelValues(r)
	}
	for _, r := range []string{reasonInFlight, reasonRate, reasonPinned} {
		m.refused.WithLabelValues(r)
	}
	for _, l := range []string{limitSandbox, limitNode} {
		m.connsRejected.WithLabelValues(l)
	}
	return m
}

func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	m.queries.Describe(ch)
	m.refused.Describe(ch)
	m.connsRejected.Describe(ch)
	m.addrsDropped.Describe(ch)
}

func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.queries.Collect(ch)
	m.refused.Collect(ch)
	m.connsRejected.Collect(ch)
	m.addrsDropped.Collect(ch)
}

// Collector returns the server's metrics for a Prometheus registry.
func (s *Server) Collector() prometheus.Collector { return s.metrics }

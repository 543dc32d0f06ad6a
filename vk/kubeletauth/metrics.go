package kubeletauth

import "github.com/prometheus/client_golang/prometheus"

// Outcomes of a request on the kubelet port.
const (
	outcomeAllowed         = "allowed"
	outcomeUnauthenticated = "unauthenticated"
	outcomeForbidden       = "forbidden"
	outcomeError           = "error"
)

var metricRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "sandman_vk_kubelet_requests_total",
	Help: "Requests on the virtual node's kubelet port by outcome: allowed, unauthenticated (401), forbidden (403), error (the authorization review failed, 500).",
}, []string{"outcome"})

// Collectors are the package's metrics, for the process's registry.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{metricRequests}
}

package vk

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
)

var (
	metricPodsCreated = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sandman_vk_pods_created_total",
		Help: "Pods the virtual node was asked to create.",
	})
	metricCreateToBound = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sandman_vk_create_to_bound_seconds",
		Help:    "Time from CreatePod to the sandbox's containers running, in seconds.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
	})
	metricCreateToReady = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sandman_vk_create_to_ready_seconds",
		Help:    "Time from CreatePod to the sandbox's daemon answering, in seconds.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
	})
	metricStage = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "sandman_vk_pod_stage_seconds",
		Help: "Time a pod spent in each stage between CreatePod and its Ready status handed to virtual-kubelet, in seconds: " +
			"admit (CreatePod to a node chosen: admission queue and placement), bind (the node API bind call), " +
			"ready (bind answered to the node's ready event: the daemon taking its assignment), " +
			"notify (the node's ready event to the provider: the agent's watch stream and the pool), " +
			"status (the provider to the status handed to virtual-kubelet: the status queue).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 18),
	}, []string{"stage"})
	metricBindFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sandman_vk_bind_failures_total",
		Help: "Binds that failed, by reason.",
	}, []string{"reason"})
	metricReleases = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sandman_vk_releases_total",
		Help: "Sandboxes released, by cause (deleted: the pod was deleted; ended: its containers exited; orphan: its pod was gone).",
	}, []string{"cause"})
	metricReleaseSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "sandman_vk_release_seconds",
		Help:    "From DeletePod to the node agent's answer that the sandbox is released (its grace period included).",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
	})
	metricWaitingUntold = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sandman_vk_waiting_statuses_dropped_total",
		Help: "Pods queued for a slot that had one (or were gone) before the paced waiting lane wrote their WaitingForSlot status and event.",
	})
	metricDeletesSeen = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sandman_vk_deletions_seen_total",
		Help: "Pod deletions whose release started from the provider's own watch of the pod informer, before virtual-kubelet's pod controller asked.",
	})
)

var metricReclaims = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "sandman_vk_reclaims_total",
	Help: "Sandboxes reclaimed by the control plane, by reason (DeadlineExceeded, IdleTimeout) and the worker node they were on.",
}, []string{"reason", "node"})

var (
	metricStatusUpdates = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "sandman_vk_status_updates_total",
		Help: "Pod statuses handed to virtual-kubelet for writing to the apiserver (the writes themselves are counted in sandman_vk_apiserver_requests_total{resource=\"pods/status\"}).",
	})
	metricAPIRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sandman_vk_apiserver_requests_total",
		Help: "Requests from the virtual node to the apiserver by verb, resource (pods/status for status writes) and code (the HTTP status, or \"error\" when no answer came).",
	}, []string{"verb", "resource", "code"})
)

// Collectors are the provider's package-level metrics, for registration by
// cmd.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{metricPodsCreated, metricCreateToBound, metricCreateToReady, metricStage, metricBindFailures,
		metricReleases, metricReleaseSeconds, metricDeletesSeen, metricWaitingUntold, metricReclaims, metricStatusUpdates, metricAPIRequests}
}

// instrumentRESTConfig counts every apiserver request made through cfg in
// sandman_vk_apiserver_requests_total.
func instrumentRESTConfig(cfg *rest.Config) {
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { return countingTransport{rt} })
}

type countingTransport struct{ next http.RoundTripper }

func (t countingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.next.RoundTrip(req)
	code := "error"
	if err == nil {
		code = strconv.Itoa(resp.StatusCode)
	}
	metricAPIRequests.WithLabelValues(verbOf(req), resourceOf(req.URL.Path), code).Inc()
	return resp, err
}

func verbOf(req *http.Request) string {
	switch req.Method {
	case http.MethodGet:
		if req.URL.Query().Get("watch") == "true" {
			return "watch"
		}
		return "get"
	case http.MethodPost:
		return "create"
	case http.MethodPut:
		return "update"
	case http.MethodPatch:
		return "patch"
	case http.MethodDelete:
		return "delete"
	}
	return strings.ToLower(req.Method)
}

// resourceOf reads the resource (and subresource) from an API path:
// /api/v1/namespaces/ns/pods/name/status → pods/status.
func resourceOf(path string) string {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	switch {
	case len(parts) >= 2 && parts[0] == "api":
		parts = parts[2:]
	case len(parts) >= 3 && parts[0] == "apis":
		parts = parts[3:]
	default:
		return "other"
	}
	if len(parts) >= 2 && parts[0] == "namespaces" {
		if len(parts) == 2 {
			return "namespaces"
		}
		parts = parts[2:]
	}
	switch len(parts) {
	case 0:
		return "discovery"
	case 1, 2:
		return parts[0]
	}
	return parts[0] + "/" + parts[2]
}

// Collector reports the virtual node's pods by phase at scrape time.
func (p *Provider) Collector() prometheus.Collector { return providerCollector{p} }

type providerCollector struct{ p *Provider }

var (
	descPods         = prometheus.NewDesc("sandman_vk_pods", "Pods on the virtual node by phase (Pending, Running, Succeeded, Failed).", []string{"phase"}, nil)
	descControlKeys  = prometheus.NewDesc("sandman_vk_control_keys", "Control keys this process holds: current (1) and previous (still tried, and re-keyed from).", []string{"key"}, nil)
	descOnPrevious   = prometheus.NewDesc("sandman_vk_sandboxes_on_previous_control_key", "Authenticated sandboxes (running, or queued) not yet known to hold the current control key's token. 0 after a rotation once every sandbox is re-keyed: then control-key-previous can be removed.", nil, nil)
	controlKeyLabels = []string{"current", "previous"}
)

func (c providerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descPods
	ch <- descControlKeys
	ch <- descOnPrevious
}

func (c providerCollector) Collect(ch chan<- prometheus.Metric) {
	counts := c.p.podsByPhase()
	for _, ph := range []corev1.PodPhase{corev1.PodPending, corev1.PodRunning, corev1.PodSucceeded, corev1.PodFailed} {
		ch <- prometheus.MustNewConstMetric(descPods, prometheus.GaugeValue, float64(counts[ph]), string(ph))
	}
	if k := c.p.cfg.ControlKeys; k != nil {
		keys := k.set.Load()
		ch <- prometheus.MustNewConstMetric(descControlKeys, prometheus.GaugeValue, 1, controlKeyLabels[0])
		ch <- prometheus.MustNewConstMetric(descControlKeys, prometheus.GaugeValue, float64(len(keys.previous)), controlKeyLabels[1])
		ch <- prometheus.MustNewConstMetric(descOnPrevious, prometheus.GaugeValue, float64(c.p.onPreviousKey(keys)))
	}
}

// onPreviousKey counts the sandboxes not known to hold keys' current key.
func (p *Provider) onPreviousKey(keys *keySet) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, sb := range p.byUID {
		if onPreviousKeyLocked(sb, keys) {
			n++
		}
	}
	return n
}

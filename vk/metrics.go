package vk

import "github.com/prometheus/client_golang/prometheus"

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
	metricBindFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sandman_vk_bind_failures_total",
		Help: "Binds that failed, by reason.",
	}, []string{"reason"})
	metricReleases = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "sandman_vk_releases_total",
		Help: "Sandboxes released, by cause (deleted: the pod was deleted; ended: its containers exited; orphan: its pod was gone).",
	}, []string{"cause"})
)

var metricReclaims = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "sandman_vk_reclaims_total",
	Help: "Sandboxes reclaimed by the control plane, by reason (DeadlineExceeded, …).",
}, []string{"reason"})

// Collectors are the provider's metrics, for registration by cmd.
func Collectors() []prometheus.Collector {
	return []prometheus.Collector{metricPodsCreated, metricCreateToBound, metricCreateToReady, metricBindFailures, metricReleases, metricReclaims}
}

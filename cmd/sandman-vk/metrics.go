package main

import (
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sandman-dev/sandman/pool"
	"github.com/sandman-dev/sandman/vk"
	"github.com/sandman-dev/sandman/vk/kubeletauth"
)

// serveMetrics serves /metrics, /healthz, the capacity page and, with
// --debug-pprof, /debug/pprof/ on l until the returned server is closed.
func serveMetrics(l net.Listener, o options, pl *pool.Pool, provider *vk.Provider) *http.Server {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(pool.Collectors()...)
	reg.MustRegister(vk.Collectors()...)
	reg.MustRegister(kubeletauth.Collectors()...)
	reg.MustRegister(pl.Collector(), provider.Collector())
	metrics := http.NewServeMux()
	metrics.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	provider.AttachCapacity(metrics)
	if o.pprof {
		metrics.HandleFunc("/debug/pprof/", pprof.Index)
		metrics.HandleFunc("/debug/pprof/profile", pprof.Profile)
		metrics.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		metrics.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	metrics.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	msrv := &http.Server{Handler: metrics, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = msrv.Serve(l) }()
	return msrv
}

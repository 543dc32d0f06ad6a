package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	daemonapi "github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
)

// benchPorts: HTTP to a web server in a sandbox (python3 -m http.server
// on port 8000 in E2B's base image), through the gateway by getHost's
// host name, <port>-<sandboxID>.<domain> in Host, against the same
// requests straight to the pod's IP, in one run: latency of sequential
// GETs on a kept-alive connection, interleaved (direct, gateway, direct,
// …) so drift hits both alike, and throughput of workers concurrent
// GETs for a few seconds each way.
func benchPorts(ctx context.Context, b *vkBench, gw *benchGateway, n int) ([]row, error) {
	image := b.env["E2B_BASE_IMAGE"]
	if image == "" {
		return nil, fmt.Errorf("E2B_BASE_IMAGE is not in the stack's env: run hack/local-up.sh again")
	}
	sb, err := gw.create(ctx, "real", image)
	if err != nil {
		return nil, err
	}
	defer gw.kill(sb.id)
	pod, err := b.kube.CoreV1().Pods(sb.namespace).Get(ctx, sb.id, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	d, err := client.New(pod.Status.PodIP+":49983", client.WithToken(sb.token))
	if err != nil {
		return nil, err
	}
	if _, err := d.StartProcess(ctx, daemonapi.ProcessRequest{Shell: "cd /tmp && head -c 1024 /dev/zero > page && exec python3 -m http.server 8000 >/dev/null 2>&1"}); err != nil {
		return nil, fmt.Errorf("start the sandbox's web server: %w", err)
	}
	direct := "http://" + net.JoinHostPort(pod.Status.PodIP, "8000") + "/page"
	viaGW := gw.url + "/page"
	host := "8000-" + sb.id + ".e2b.local"
	get := func(c *http.Client, url, host string) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if host != "" {
			req.Host = host
		}
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		nb, err := io.Copy(io.Discard, resp.Body)
		if err == nil && (resp.StatusCode != http.StatusOK || nb != 1024) {
			err = fmt.Errorf("%s: %s, %d bytes", url, resp.Status, nb)
		}
		return err
	}
	newClient := func(conns int) *http.Client {
		return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns}, Timeout: 10 * time.Second}
	}
	cd, cg := newClient(1), newClient(1)
	defer cd.CloseIdleConnections()
	defer cg.CloseIdleConnections()
	deadline := time.Now().Add(30 * time.Second)
	for get(cd, direct, "") != nil || get(cg, viaGW, host) != nil {
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("the sandbox's web server did not answer in 30 s (direct: %v; via the gateway: %v)", get(cd, direct, ""), get(cg, viaGW, host))
		}
		time.Sleep(100 * time.Millisecond)
	}
	var dd, gd durations
	for range n {
		for _, c := range []struct {
			client    *http.Client
			url, host string
			into      *durations
		}{{cd, direct, "", &dd}, {cg, viaGW, host, &gd}} {
			start := time.Now()
			if err := get(c.client, c.url, c.host); err != nil {
				return nil, err
			}
			*c.into = append(*c.into, time.Since(start))
		}
	}

	const workers, span = 8, 3 * time.Second
	throughput := func(url, host string) (float64, error) {
		c := newClient(workers)
		defer c.CloseIdleConnections()
		var done atomic.Int64
		var first error
		var mu sync.Mutex
		var wg sync.WaitGroup
		end := time.Now().Add(span)
		for range workers {
			wg.Go(func() {
				for time.Now().Before(end) {
					if err := get(c, url, host); err != nil {
						mu.Lock()
						if first == nil {
							first = err
						}
						mu.Unlock()
						return
					}
					done.Add(1)
				}
			})
		}
		wg.Wait()
		return float64(done.Load()) / span.Seconds(), first
	}
	td, err := throughput(direct, "")
	if err != nil {
		return nil, fmt.Errorf("direct throughput: %w", err)
	}
	tg, err := throughput(viaGW, host)
	if err != nil {
		return nil, fmt.Errorf("throughput via the gateway: %w", err)
	}
	extra := gd.p50() - dd.p50()
	return []row{
		{name: "HTTP GET 1 KiB from a sandbox's web server, direct to the pod IP (baseline)", n: len(dd), p50: ms(dd.p50()), p99: ms(dd.p99()), baseline: "-", ratio: "1.00×",
			note: fmt.Sprintf("%.0f requests/s with %d concurrent clients", td, workers)},
		{name: "HTTP GET 1 KiB through the gateway by getHost (Host: 8000-<id>.<domain>)", n: len(gd), p50: ms(gd.p50()), p99: ms(gd.p99()), baseline: "direct", ratio: ratio(gd.p50(), dd.p50()),
			note: fmt.Sprintf("extra p50 %s (target ≤ +1 ms); %.0f requests/s with %d concurrent clients (%.0f%% of direct)", ms(extra), tg, workers, 100*tg/td)},
	}, nil
}

package gateway

import (
	"context"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The SDK's single-endpoint mode (E2B_SANDBOX_URL) sends every daemon call
// to that one URL and names the sandbox and port in these headers
// (dist/index.js, the Sandbox constructor's sandboxHeaders).
const (
	headerSandboxID   = "E2b-Sandbox-Id"
	headerSandboxPort = "E2b-Sandbox-Port"
)

// proxyError is the body of the proxy's own answers. 502 is what the SDK
// reads as "the sandbox is gone": isRunning() answers false on a 502 from
// /health, and a Connect call that gets 502 (code unavailable) becomes a
// TimeoutError saying the sandbox probably timed out (dist/index.js
// Sandbox.isRunning, envd DEFAULT_ERROR_MAP, formatSandboxTimeoutError).
type proxyError struct {
	Code      int    `json:"code"`
	Message   string `json:"message"`
	SandboxID string `json:"sandboxID,omitempty"`
}

type targetKey struct{}

func (g *Gateway) newProxy() http.Handler {
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = pr.In.Context().Value(targetKey{}).(string)
			pr.Out.Host = ""
			// Everything else, the access token and the E2b-Sandbox-*
			// headers included, goes to the daemon as it came.
		},
		Transport: g.cfg.Transport,
		// Connect server streams (command output, directory watches):
		// each chunk goes out as soon as the daemon writes it.
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			metricProxied.WithLabelValues(strconv.Itoa(resp.StatusCode)).Inc()
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			if r.Context().Err() != nil {
				metricProxied.WithLabelValues("canceled").Inc()
				return
			}
			id := r.Header.Get(headerSandboxID)
			g.log.Debug("proxy", "sandbox", id, "err", err)
			g.proxyFail(w, http.StatusBadGateway, id, "sandbox "+id+": its daemon did not answer: "+err.Error())
		},
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(headerSandboxID)
		if id == "" {
			g.proxyFail(w, http.StatusBadRequest, "", "sandbox traffic needs the "+headerSandboxID+" header (E2B_SANDBOX_URL mode); the control API is on the API URL")
			return
		}
		if p := r.Header.Get(headerSandboxPort); p != "" && p != strconv.Itoa(daemonPort) {
			// Only the daemon checks an access token: any other port of
			// a sandbox would be open to whoever reaches the gateway.
			g.proxyFail(w, http.StatusBadRequest, id, "port "+p+": only the sandbox daemon's port "+strconv.Itoa(daemonPort)+" is reachable through sandman's gateway")
			return
		}
		if !g.Ready() {
			g.proxyFail(w, http.StatusServiceUnavailable, id, "the gateway is starting: retry in a moment")
			return
		}
		addr, ok := g.route(r.Context(), id)
		if !ok {
			if r.Context().Err() != nil {
				metricProxied.WithLabelValues("canceled").Inc()
				return
			}
			g.proxyFail(w, http.StatusBadGateway, id, "sandbox "+id+" was not found or is not running")
			return
		}
		if r.ProtoMajor == 1 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/connect+") {
			// A Connect stream (command output, a watch) over HTTP/1.1
			// gets a connection of its own. With the SDK's HTTP client
			// (undici) reusing them, a stream opened just after another
			// was aborted (a command re-attached after disconnect, a
			// watch stopped) was now and then cut ("terminated"): 5 in
			// 30 re-attaches under CPU load, none in 60 with this, none
			// direct to a daemon either. Streams last long; one TCP
			// handshake each costs nothing. (HTTP/2 multiplexes and
			// needs nothing of the kind.)
			w.Header().Set("Connection", "close")
		}
		rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), targetKey{}, addr)))
	})
}

func (g *Gateway) proxyFail(w http.ResponseWriter, status int, id, msg string) {
	metricProxied.WithLabelValues(strconv.Itoa(status)).Inc()
	writeJSON(w, status, proxyError{Code: status, Message: msg, SandboxID: id})
}

// route finds the daemon address of sandbox id. A sandbox this replica
// does not know yet (made a moment ago through another replica) or whose
// pod has no address yet is waited for, up to ProxyWait; one whose pod is
// gone is not.
func (g *Gateway) route(ctx context.Context, id string) (string, bool) {
	changed, stop := g.waiters.watch("id/" + id)
	defer stop()
	var timer <-chan time.Time
	for {
		objs, _ := g.pods.GetIndexer().ByIndex(indexSandboxID, id)
		waiting := false
		for _, obj := range objs {
			pod, ok := obj.(*corev1.Pod)
			if !ok || !isSandboxPod(pod, id) || !alive(pod) {
				continue
			}
			if pod.Status.Phase == corev1.PodRunning && pod.Status.PodIP != "" {
				return net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(daemonPort)), true
			}
			waiting = true
		}
		if !waiting && (len(objs) > 0 || g.tomb.has(id)) {
			return "", false // ended or deleted
		}
		if timer == nil {
			t := time.NewTimer(g.cfg.ProxyWait)
			defer t.Stop()
			timer = t.C
		}
		select {
		case <-changed:
		case <-timer:
			return "", false
		case <-ctx.Done():
			return "", false
		}
	}
}

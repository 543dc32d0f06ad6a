package gateway

import (
	"net"
	"net/http"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// target is the sandbox and port a sandbox request is for.
type target struct {
	id   string
	port int
}

// sandboxHost reads E2B's sandbox host, <port>-<sandboxID>.<domain>
// (ConnectionConfig.getHost in the SDK, what Sandbox.getHost(port)
// returns): ok is false for any other host. With a sandbox domain set only
// hosts under it count; without one, any domain does (the SDK's
// E2B_DOMAIN is then the caller's business, and the control API is never
// reached under such a name).
func sandboxHost(host, domain string) (target, bool) {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, rest, ok := strings.Cut(host, ".")
	if !ok || rest == "" {
		return target{}, false
	}
	if domain != "" && !strings.EqualFold(rest, domain) {
		return target{}, false
	}
	p, id, ok := strings.Cut(label, "-")
	port, err := strconv.Atoi(p)
	if !ok || err != nil || port < 1 || port > 65535 || len(validation.IsDNS1123Label(id)) > 0 {
		return target{}, false
	}
	return target{id: id, port: port}, true
}

// requestTarget is the sandbox and port a request is for: its Host when
// that is a sandbox host (sandboxHost), else the SDK's single-endpoint
// headers, E2b-Sandbox-Id and E2b-Sandbox-Port (the daemon's port when
// absent). ok is false for a request that names no sandbox; err says what
// is wrong with one that names it badly.
func requestTarget(r *http.Request, domain string) (t target, ok bool, errMsg string) {
	if t, ok := sandboxHost(r.Host, domain); ok {
		return t, true, ""
	}
	id := r.Header.Get(headerSandboxID)
	if id == "" {
		return target{}, false, ""
	}
	t = target{id: id, port: daemonPort}
	if p := r.Header.Get(headerSandboxPort); p != "" {
		port, err := strconv.Atoi(p)
		if err != nil || port < 1 || port > 65535 {
			return t, true, headerSandboxPort + " " + strconv.Quote(p) + " is not a port (1-65535)"
		}
		t.port = port
	}
	return t, true, ""
}

// isSandboxTraffic says whether a request on the shared listener is for
// a sandbox rather than the control API.
func (g *Gateway) isSandboxTraffic(r *http.Request) bool {
	if r.Header.Get(headerSandboxID) != "" {
		return true
	}
	_, ok := sandboxHost(r.Host, g.cfg.SandboxDomain)
	return ok
}

package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"syscall"
	"testing"

	"github.com/sandman-dev/sandman/podcontract"
)

// portSeen is what reached a sandbox's web server.
type portSeen struct {
	host, forwardedHost, traffic, access, path string
}

// portServer stands in for a web server in the sandbox: it answers 200
// with what it saw.
func portServer(w http.ResponseWriter, r *http.Request) {
	_ = json.NewEncoder(w).Encode(map[string]string{"host": r.Host, "forwardedHost": r.Header.Get("X-Forwarded-Host"),
		"traffic": r.Header.Get(headerTrafficToken), "access": r.Header.Get("X-Access-Token"), "path": r.URL.Path})
}

// portRequest is a request to port of sandbox id: by the SDK's headers,
// or, with host set, by Host alone (getHost's <port>-<id>.<domain>).
func (e *env) portRequest(id, port, host, traffic string) (int, portSeen, portError) {
	e.t.Helper()
	req, err := http.NewRequest(http.MethodGet, e.srv.URL+"/index.html", nil)
	if err != nil {
		e.t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	} else {
		req.Header.Set("E2b-Sandbox-Id", id)
		req.Header.Set("E2b-Sandbox-Port", port)
	}
	if traffic != "" {
		req.Header.Set("E2B-Traffic-Access-Token", traffic)
	}
	resp, err := e.http.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var s map[string]string
	var pe portError
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(b, &s); err != nil {
			e.t.Fatalf("200 with %q", b)
		}
		return resp.StatusCode, portSeen{host: s["host"], forwardedHost: s["forwardedHost"], traffic: s["traffic"], access: s["access"], path: s["path"]}, pe
	}
	if err := json.Unmarshal(b, &pe); err != nil {
		e.t.Fatalf("status %d with %q", resp.StatusCode, b)
	}
	return resp.StatusCode, portSeen{}, pe
}

func (e *env) lastDial() string {
	e.t.Helper()
	var last string
	for {
		select {
		case a := <-e.dialed:
			last = a
		default:
			return last
		}
	}
}

// A sandbox's web server is reached through the gateway on any port, by
// the SDK's headers and by getHost's host name; the pod opens the
// gateway's ports to the control plane (sandman.io/control-ports).
func TestPortPublic(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.SandboxDomain = "sandbox.test" })
	e.setDaemon(http.HandlerFunc(portServer))
	sb, pod := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base"})
	if sb.TrafficAccessToken != nil {
		t.Errorf("a public sandbox got a traffic token: %q", *sb.TrafficAccessToken)
	}
	if got := pod.Annotations[podcontract.AnnotationControlPorts]; got != "1-65535" {
		t.Errorf("%s = %q, want the gateway's default 1-65535", podcontract.AnnotationControlPorts, got)
	}
	e.lastDial()
	code, seen, pe := e.portRequest(sb.SandboxID, "8000", "", "")
	if code != http.StatusOK {
		t.Fatalf("by headers: %d %+v", code, pe)
	}
	if d := e.lastDial(); d != daemonAddr+":8000" {
		t.Errorf("dialled %s, want the pod's port 8000", d)
	}
	if seen.path != "/index.html" || seen.access != "" {
		t.Errorf("the server saw %+v", seen)
	}
	host := "8000-" + sb.SandboxID + ".sandbox.test"
	code, seen, pe = e.portRequest("", "", host, "")
	if code != http.StatusOK || seen.host != host || seen.forwardedHost != "" {
		t.Fatalf("by host: %d %+v %+v", code, seen, pe)
	}
	// The daemon's port by host name is the daemon, which needs its token.
	code, _, _ = e.portRequest("", "", "49983-"+sb.SandboxID+".sandbox.test:443", "")
	if code != http.StatusUnauthorized {
		t.Errorf("the daemon by host without a token: %d, want 401", code)
	}
	// Another domain's name is no sandbox's: the control API answers.
	if r := e.call(http.MethodGet, "/", "", nil); r.status != http.StatusNotFound {
		t.Fatalf("control API: %d", r.status)
	}
	req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/index.html", nil)
	req.Host = "8000-" + sb.SandboxID + ".elsewhere.test"
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(b), "no such endpoint") {
		t.Errorf("a host under another domain: %d %s, want the control API's 404", resp.StatusCode, b)
	}
	// An unknown sandbox's port: 502 at once, as for its daemon.
	if code, _, pe := e.portRequest("neverwas", "8000", "", ""); code != http.StatusBadGateway || pe.SandboxID != "neverwas" {
		t.Errorf("unknown sandbox: %d %+v", code, pe)
	}
}

// allowPublicTraffic false: the ports take only the sandbox's traffic
// access token, which create and connect return, in
// e2b-traffic-access-token; the daemon still takes only its own token.
func TestPortTrafficToken(t *testing.T) {
	e := newEnv(t)
	e.setDaemon(http.HandlerFunc(portServer))
	private := map[string]any{"templateID": "base", "network": map[string]any{"allowPublicTraffic": false}}
	sb, pod := e.createReady(rawKeyA, nsA, private)
	other, _ := e.createReady(rawKeyA, nsA, private)
	if sb.TrafficAccessToken == nil || *sb.TrafficAccessToken == "" || *sb.TrafficAccessToken == sb.EnvdAccessToken {
		t.Fatalf("traffic token %v (envd token %q)", sb.TrafficAccessToken, sb.EnvdAccessToken)
	}
	if pod.Annotations[podcontract.AnnotationE2BPublicTraffic] != "false" {
		t.Errorf("annotations %v", pod.Annotations)
	}
	for _, a := range pod.Annotations {
		if strings.Contains(a, *sb.TrafficAccessToken) {
			t.Errorf("the pod carries the traffic token")
		}
	}
	var conn sandboxJSON
	if r := e.call(http.MethodPost, "/v2/sandboxes/"+sb.SandboxID+"/connect", rawKeyA, map[string]any{"timeout": 60}); r.status != http.StatusOK {
		t.Fatalf("connect: %d %s", r.status, r.body)
	} else {
		r.decode(t, &conn)
	}
	if conn.TrafficAccessToken == nil || *conn.TrafficAccessToken != *sb.TrafficAccessToken {
		t.Errorf("connect's traffic token %v, want create's", conn.TrafficAccessToken)
	}
	e.lastDial()
	for _, tc := range []struct {
		name, token, want string
	}{
		{"none", "", "Token header 'e2b-traffic-access-token' is missing"},
		{"another sandbox's", *other.TrafficAccessToken, "is invalid"},
		{"the envd access token", sb.EnvdAccessToken, "is invalid"},
		{"garbage", "x", "is invalid"},
	} {
		code, _, pe := e.portRequest(sb.SandboxID, "8000", "", tc.token)
		if code != http.StatusForbidden || !strings.Contains(pe.Message, tc.want) || pe.SandboxID != sb.SandboxID {
			t.Errorf("%s: %d %+v, want 403 saying %q", tc.name, code, pe, tc.want)
		}
	}
	if d := e.lastDial(); d != "" {
		t.Errorf("refused requests dialled %s", d)
	}
	code, seen, pe := e.portRequest(sb.SandboxID, "8000", "", *sb.TrafficAccessToken)
	if code != http.StatusOK {
		t.Fatalf("with its token: %d %+v", code, pe)
	}
	if seen.traffic != "" {
		t.Errorf("the sandbox's server was given the traffic token")
	}
	// The traffic token does not open the daemon.
	req := e.sandboxRequestToken(context.Background(), sb.SandboxID, *sb.TrafficAccessToken, "49983", "/envs")
	req.Method = http.MethodGet
	req.Header.Del("Content-Type")
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("the daemon with the traffic token: %d, want 401", resp.StatusCode)
	}
}

// maskRequestHost is the Host the sandbox's server sees, ${PORT} filled
// in; the Host asked for goes in X-Forwarded-Host.
func TestPortMaskRequestHost(t *testing.T) {
	e := newEnv(t)
	e.setDaemon(http.HandlerFunc(portServer))
	sb, pod := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base", "network": map[string]any{"maskRequestHost": "localhost:${PORT}"}})
	if pod.Annotations[podcontract.AnnotationE2BMaskRequestHost] != "localhost:${PORT}" {
		t.Errorf("annotations %v", pod.Annotations)
	}
	code, seen, pe := e.portRequest(sb.SandboxID, "3000", "", "")
	if code != http.StatusOK || seen.host != "localhost:3000" || seen.forwardedHost != strings.TrimPrefix(e.srv.URL, "http://") {
		t.Fatalf("%d %+v %+v", code, seen, pe)
	}
	for _, bad := range []map[string]any{
		{"maskRequestHost": "a b"},
		{"maskRequestHost": "evil.test/path"},
		{"maskRequestHost": strings.Repeat("a", 400)},
	} {
		if r := e.call(http.MethodPost, "/v2/sandboxes", rawKeyA, map[string]any{"templateID": "base", "network": bad}); r.status != http.StatusBadRequest {
			t.Errorf("%v: %d %s", bad, r.status, r.body)
		}
	}
}

// httpsPorts: the gateway speaks TLS to the sandbox's server on those
// ports (its self-signed certificate accepted), plain HTTP on the others;
// getInfo shows the sandbox's network; bad ports are refused.
func TestPortHTTPS(t *testing.T) {
	tlsSrv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]string{"host": r.Host, "path": "tls:" + r.URL.Path})
	}))
	t.Cleanup(tlsSrv.Close)
	e := newEnv(t, func(c *Config) {
		inner := c.Transport.(*http.Transport)
		c.Transport = &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if strings.HasSuffix(addr, ":8443") {
				var d net.Dialer
				return d.DialContext(ctx, "tcp", tlsSrv.Listener.Addr().String())
			}
			return inner.DialContext(ctx, network, addr)
		}}
	})
	e.setDaemon(http.HandlerFunc(portServer))
	sb, pod := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base", "network": map[string]any{
		"httpsPorts": []int{8443, 8443, 9443}, "allowPublicTraffic": false, "denyOut": []string{"10.1.0.0/16"}}})
	if got := pod.Annotations[podcontract.AnnotationE2BHTTPSPorts]; got != "8443,9443" {
		t.Errorf("annotation %q", got)
	}
	traffic := e.gw.trafficToken(&pod)
	if code, seen, pe := e.portRequest(sb.SandboxID, "8443", "", *traffic); code != http.StatusOK || seen.path != "tls:/index.html" {
		t.Errorf("https port: %d %+v %+v", code, seen, pe)
	}
	if code, seen, pe := e.portRequest(sb.SandboxID, "3000", "", *traffic); code != http.StatusOK || seen.path != "/index.html" {
		t.Errorf("http port: %d %+v %+v", code, seen, pe)
	}
	var info struct {
		Network networkInfo `json:"network"`
	}
	e.call(http.MethodGet, "/sandboxes/"+sb.SandboxID, rawKeyA, nil).decode(t, &info)
	if n := info.Network; n.AllowPublicTraffic || len(n.HTTPSPorts) != 2 || n.HTTPSPorts[1] != 9443 || len(n.DenyOut) != 1 || n.DenyOut[0] != "10.1.0.0/16" {
		t.Errorf("getInfo network: %+v", n)
	}
	for _, bad := range []any{[]int{0}, []int{70000}, []string{"x"}, make([]int, maxHTTPSPorts+1)} {
		if r := e.call(http.MethodPost, "/v2/sandboxes", rawKeyA, map[string]any{"templateID": "base", "network": map[string]any{"httpsPorts": bad}}); r.status != http.StatusBadRequest {
			t.Errorf("httpsPorts %v: %d %s", bad, r.status, r.body)
		}
	}
}

// A port nothing listens on, and a port the sandbox's firewall closes to
// the gateway, answer 502 at once with what happened.
func TestPortClosed(t *testing.T) {
	e := newEnv(t, func(c *Config) {
		c.SandboxPorts = "8000-9000"
		inner := c.Transport.(*http.Transport)
		c.Transport = &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			switch {
			case strings.HasSuffix(addr, ":8001"):
				return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
			case strings.HasSuffix(addr, ":9001"):
				return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.EHOSTUNREACH}
			}
			return inner.DialContext(ctx, network, addr)
		}}
	})
	e.setDaemon(http.HandlerFunc(portServer))
	sb, pod := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base"})
	if got := pod.Annotations[podcontract.AnnotationControlPorts]; got != "8000-9000" {
		t.Errorf("control ports %q", got)
	}
	for port, want := range map[string]string{
		"8001": "The sandbox is running but port is not open",
		"9001": "closed by the sandbox's ingress rules",
	} {
		code, _, pe := e.portRequest(sb.SandboxID, port, "", "")
		if code != http.StatusBadGateway || pe.Port != port || !strings.Contains(pe.Message, want) {
			t.Errorf("port %s: %d %+v, want 502 saying %q", port, code, pe, want)
		}
	}
	if _, err := New(Config{Client: e.client, Tokens: e.gw.cfg.Tokens, Keys: map[string][]byte{}, SandboxPorts: "80,x"}); err == nil {
		t.Error("New took sandbox ports 80,x")
	}
}

// A websocket (an HTTP/1.1 upgrade) to a sandbox's port is passed
// through both ways.
func TestPortWebsocket(t *testing.T) {
	e := newEnv(t)
	e.setDaemon(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "websocket" {
			http.Error(w, "want an upgrade", http.StatusBadRequest)
			return
		}
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return
		}
		defer conn.Close()
		_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
		_ = brw.Flush()
		line, _ := brw.ReadString('\n')
		_, _ = brw.WriteString("echo " + line)
		_ = brw.Flush()
	}))
	sb, _ := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base"})
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, _ = io.WriteString(conn, "GET /ws HTTP/1.1\r\nHost: x\r\nE2b-Sandbox-Id: "+sb.SandboxID+"\r\nE2b-Sandbox-Port: 8765\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n")
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	_, _ = io.WriteString(conn, "hello\n")
	line, err := br.ReadString('\n')
	if err != nil || line != "echo hello\n" {
		t.Fatalf("through the websocket: %q %v", line, err)
	}
}

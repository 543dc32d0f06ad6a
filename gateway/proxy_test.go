package gateway

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// sandboxRequest is a daemon call as the SDK sends it in E2B_SANDBOX_URL
// mode.
// The token is the sandbox's (as the gateway derives it for a sandbox of
// namespace team-a).
func (e *env) sandboxRequest(ctx context.Context, id, port, path string) *http.Request {
	return e.sandboxRequestToken(ctx, id, e.gw.cfg.Tokens.New(nsA, id), port, path)
}

// sandboxRequestToken is sandboxRequest with a token of the caller's
// choosing ("": none).
func (e *env) sandboxRequestToken(ctx context.Context, id, token, port, path string) *http.Request {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.srv.URL+path, strings.NewReader(`{"process":{"cmd":"ls"}}`))
	if err != nil {
		e.t.Fatal(err)
	}
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", port)
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	req.Header.Set("Content-Type", "application/connect+json")
	return req
}

func TestProxyStreams(t *testing.T) {
	for _, proto := range []string{"HTTP/1.1", "h2c"} {
		t.Run(proto, func(t *testing.T) {
			e := newEnv(t)
			sb, _ := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base"})
			release := make(chan struct{})
			e.setDaemon(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				// What reached the daemon: the path, the token and the
				// sandbox headers as the client sent them.
				w.Header().Set("Content-Type", "application/connect+json")
				w.Header().Set("X-Seen-Token", r.Header.Get("X-Access-Token"))
				w.Header().Set("X-Seen-Sandbox", r.Header.Get("E2b-Sandbox-Id"))
				w.Header().Set("X-Seen-Path", r.URL.Path)
				body, _ := io.ReadAll(r.Body)
				w.Header().Set("X-Seen-Body", string(body))
				_, _ = io.WriteString(w, "first\n")
				_ = http.NewResponseController(w).Flush()
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
				_, _ = io.WriteString(w, "second\n")
			}))
			client := &http.Client{Transport: &http.Transport{}}
			if proto == "h2c" {
				var p http.Protocols
				p.SetUnencryptedHTTP2(true)
				client.Transport = &http.Transport{Protocols: &p}
			}
			defer client.CloseIdleConnections()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			resp, err := client.Do(e.sandboxRequest(ctx, sb.SandboxID, "49983", "/process.Process/Start"))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if (proto == "h2c") != (resp.ProtoMajor == 2) {
				t.Fatalf("answered over %s", resp.Proto)
			}
			// A stream over HTTP/1.1 ends its connection (see newProxy).
			if want := resp.ProtoMajor == 1; resp.Close != want {
				t.Errorf("over %s the stream's connection closes after it: %v, want %v", resp.Proto, resp.Close, want)
			}
			if resp.StatusCode != http.StatusOK {
				b, _ := io.ReadAll(resp.Body)
				t.Fatalf("status %d: %s", resp.StatusCode, b)
			}
			for h, want := range map[string]string{"X-Seen-Token": sb.EnvdAccessToken, "X-Seen-Sandbox": sb.SandboxID,
				"X-Seen-Path": "/process.Process/Start", "X-Seen-Body": `{"process":{"cmd":"ls"}}`} {
				if got := resp.Header.Get(h); got != want {
					t.Errorf("%s = %q, want %q", h, got, want)
				}
			}
			br := bufio.NewReader(resp.Body)
			// The first chunk arrives while the daemon still holds the
			// stream open: had the gateway buffered, this read would
			// wait until the context's deadline.
			line, err := br.ReadString('\n')
			if err != nil || line != "first\n" {
				t.Fatalf("first chunk %q: %v", line, err)
			}
			close(release)
			rest, err := io.ReadAll(br)
			if err != nil || string(rest) != "second\n" {
				t.Fatalf("rest %q: %v", rest, err)
			}
			if n := testutil.ToFloat64(metricProxied.WithLabelValues("200")); n < 1 {
				t.Errorf("proxied metric: %v", n)
			}
			select {
			case addr := <-e.dialed:
				if addr != daemonAddr+":49983" {
					t.Errorf("dialled %s, want the pod IP and the daemon port", addr)
				}
			default:
				t.Error("nothing dialled")
			}
		})
	}
}

func TestProxyUnknownSandbox(t *testing.T) {
	e := newEnv(t)
	resp, err := e.http.Do(e.sandboxRequest(context.Background(), "neverwas", "49983", "/health"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var pe proxyError
	if err := json.NewDecoder(resp.Body).Decode(&pe); err != nil || resp.StatusCode != http.StatusBadGateway || pe.SandboxID != "neverwas" || pe.Code != 502 {
		t.Fatalf("unknown sandbox: %d %+v %v", resp.StatusCode, pe, err)
	}
}

func TestProxyErrors(t *testing.T) {
	// A long wait for sandboxes in the making: a killed one must not
	// wait for it.
	e := newEnv(t, func(c *Config) { c.ProxyWait = time.Minute })
	sb, _ := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base"})
	e.setDaemon(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	do := func(id, port, path string) (int, proxyError) {
		t.Helper()
		resp, err := e.http.Do(e.sandboxRequest(context.Background(), id, port, path))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var pe proxyError
		if resp.StatusCode != http.StatusNoContent {
			if err := json.NewDecoder(resp.Body).Decode(&pe); err != nil {
				t.Fatalf("status %d, body: %v", resp.StatusCode, err)
			}
		}
		return resp.StatusCode, pe
	}
	if code, _ := do(sb.SandboxID, "49983", "/health"); code != http.StatusNoContent {
		t.Fatalf("health through the proxy: %d", code)
	}
	if code, pe := do(sb.SandboxID, "70000", "/"); code != http.StatusBadRequest || !strings.Contains(pe.Message, "not a port") {
		t.Fatalf("a port out of range: %d %+v", code, pe)
	}
	// Killed: the SDK's isRunning reads 502 from /health as "not running",
	// and gets it at once, not after the wait for a sandbox in the making.
	if r := e.call(http.MethodDelete, "/sandboxes/"+sb.SandboxID, rawKeyA, nil); r.status != http.StatusNoContent {
		t.Fatalf("kill: %d", r.status)
	}
	poll(t, "the deleted pod to leave the cache", func() bool {
		return len(e.gw.pods.byID(sb.SandboxID)) == 0
	})
	start := time.Now()
	if code, _ := do(sb.SandboxID, "49983", "/health"); code != http.StatusBadGateway {
		t.Fatalf("killed sandbox: %d", code)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("a killed sandbox's traffic waited %s", d)
	}
}

func TestProxyWaitsForNewSandbox(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.ProxyWait = 20 * time.Second })
	e.setDaemon(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) }))
	// Traffic for a sandbox another replica is making arrives first: it
	// waits for the pod to show up here with an address.
	done := make(chan int, 1)
	go func() {
		resp, err := e.http.Do(e.sandboxRequest(context.Background(), "sbxlate", "49983", "/health"))
		if err != nil {
			done <- -1
			return
		}
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	poll(t, "the request to wait", func() bool {
		e.gw.waiters.mu.Lock()
		defer e.gw.waiters.mu.Unlock()
		return len(e.gw.waiters.m["id/sbxlate"]) > 0
	})
	e.addPod(nsA, "sbxlate", testNow, nil)
	select {
	case code := <-done:
		if code != http.StatusNoContent {
			t.Fatalf("status %d", code)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("the request did not follow the new pod")
	}
}

func TestSandboxListener(t *testing.T) {
	e := newEnv(t)
	h := e.gw.SandboxHandler()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v2/sandboxes", nil))
	if rec.Code != http.StatusBadRequest {
		t.Fatalf("control call on the sandbox listener: %d", rec.Code)
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("healthz: %d", rec.Code)
	}
}

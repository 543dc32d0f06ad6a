package gateway

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// seen is what reached the stand-in daemon: the address the proxy
// dialled (the request's Host) and the token it carried.
type seen struct{ host, token string }

// recordingDaemon answers 204 to everything and records each request.
type recordingDaemon struct {
	mu   sync.Mutex
	reqs []seen
}

func (d *recordingDaemon) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	d.mu.Lock()
	d.reqs = append(d.reqs, seen{host: r.Host, token: r.Header.Get("X-Access-Token")})
	d.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}

func (d *recordingDaemon) take() []seen {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := d.reqs
	d.reqs = nil
	return out
}

// impostor stores a copy of the victim's pod, labels, annotations (token
// hash included) and all, in namespace ns, running at ip: what anyone who
// may create pods there can make.
func (e *env) impostor(victim corev1.Pod, ns, ip string) {
	e.t.Helper()
	pod := victim.DeepCopy()
	pod.Namespace, pod.ResourceVersion, pod.UID = ns, "", ""
	ready(ip)(&pod.Status)
	if _, err := e.client.CoreV1().Pods(ns).Create(context.Background(), pod, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	if e.gw.pods.watches(ns) {
		e.cached(ns, pod.Name, func(*corev1.Pod) bool { return true })
	}
}

// A pod named after another tenant's sandbox, carrying its labels, never
// gets that sandbox's traffic, its token least of all: the proxy routes a
// token only to the pod of the namespace the token was made for, whose
// hash is the token's.
func TestProxyImpostor(t *testing.T) {
	const impostorIP = "10.6.6.6"
	for _, tc := range []struct {
		name, ns string
		watch    []string // Config.Namespaces
	}{
		{"a namespace the gateway does not watch", "evil", nil},
		{"a watched namespace no key names", "evil", []string{nsA, nsB, "evil"}},
		{"another key's namespace", nsB, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(c *Config) { c.Namespaces = tc.watch })
			d := &recordingDaemon{}
			e.setDaemon(d)
			sb, victim := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base"})
			e.impostor(victim, tc.ns, impostorIP)
			// A REST-shaped call (a Connect stream's refusal is a
			// Connect end-of-stream message with status 200).
			call := func(tok string) *http.Request {
				req := e.sandboxRequestToken(context.Background(), sb.SandboxID, tok, "49983", "/process.Process/List")
				req.Header.Set("Content-Type", "application/json")
				return req
			}
			do := func(req *http.Request) (int, proxyError) {
				t.Helper()
				resp, err := e.http.Do(req)
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
			// The right token, many times (the routing table is a set:
			// before, some of these went to the impostor).
			for range 40 {
				if code, pe := do(call(sb.EnvdAccessToken)); code != http.StatusNoContent {
					t.Fatalf("the sandbox's own token: %d %+v", code, pe)
				}
			}
			for _, r := range d.take() {
				if r.host != daemonAddr+":49983" || r.token != sb.EnvdAccessToken {
					t.Fatalf("a request reached %s with token %q; want only the victim's pod %s", r.host, r.token, daemonAddr)
				}
			}
			// A token that is not the sandbox's: the impostor namespace's
			// own token for that ID, another sandbox's, garbage.
			other, _ := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base"})
			for _, tok := range []string{e.gw.cfg.Tokens.New(tc.ns, sb.SandboxID), other.EnvdAccessToken, "not-the-token"} {
				code, pe := do(call(tok))
				if code != http.StatusUnauthorized || pe.Code != http.StatusUnauthorized || !strings.Contains(pe.Message, "access token") {
					t.Errorf("token %.12s…: %d %+v, want 401 saying the token is not the sandbox's", tok, code, pe)
				}
			}
			// No token on a call that needs one.
			if code, pe := do(call("")); code != http.StatusUnauthorized || !strings.Contains(pe.Message, "X-Access-Token") {
				t.Errorf("no token: %d %+v", code, pe)
			}
			if got := d.take(); len(got) != 0 {
				t.Fatalf("refused requests were forwarded: %+v", got)
			}
			// isRunning's GET /health may come without a token: it goes to
			// the sandbox, never to a look-alike, which no token key
			// proves.
			req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/health", nil)
			req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
			req.Header.Set("E2b-Sandbox-Port", "49983")
			code, pe := do(req)
			got := d.take()
			if code != http.StatusNoContent || len(got) != 1 || got[0].host != daemonAddr+":49983" {
				t.Errorf("tokenless health: %d %+v, forwarded %+v", code, pe, got)
			}
		})
	}
}

// A Connect call refused by the proxy gets a Connect error, as the
// daemon's own refusal would be.
func TestProxyRefusalConnect(t *testing.T) {
	e := newEnv(t)
	sb, _ := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base"})
	req := e.sandboxRequestToken(context.Background(), sb.SandboxID, "wrong", "49983", "/process.Process/List")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Connect-Protocol-Version", "1")
	resp, err := e.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ce struct{ Code, Message string }
	if err := json.NewDecoder(resp.Body).Decode(&ce); err != nil || resp.StatusCode != http.StatusUnauthorized || ce.Code != "unauthenticated" {
		t.Fatalf("%d %+v %v", resp.StatusCode, ce, err)
	}
}

// BenchmarkProxy is one proxied daemon call (a 204 from an httptest
// daemon), with the proxy's token check and without it (routing by the
// ID alone, as before the check): the check's share of a call.
func BenchmarkProxy(b *testing.B) {
	e := newEnv(b)
	e.setDaemon(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}))
	e.addPod(nsA, "sbxbench", testNow, nil)
	e.cached(nsA, "sbxbench", podReady)
	token := e.gw.cfg.Tokens.New(nsA, "sbxbench")
	for _, bc := range []struct {
		name  string
		check podCheck
	}{
		{"unchecked", func(*corev1.Pod, string, string) verdict { return tokenMatches }},
		{"token-check", e.gw.tokenCheck},
	} {
		b.Run(bc.name, func(b *testing.B) {
			h := e.gw.newProxy(bc.check)
			for b.Loop() {
				req := httptest.NewRequest(http.MethodPost, "/process.Process/List", strings.NewReader("{}"))
				req.Header.Set("E2b-Sandbox-Id", "sbxbench")
				req.Header.Set("E2b-Sandbox-Port", "49983")
				req.Header.Set("X-Access-Token", token)
				req.Header.Set("Content-Type", "application/json")
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, req)
				if rec.Code != http.StatusNoContent {
					b.Fatalf("status %d: %s", rec.Code, rec.Body)
				}
			}
		})
	}
}

// BenchmarkTokenCheck is the proxy's check of one pod alone.
func BenchmarkTokenCheck(b *testing.B) {
	e := newEnv(b)
	e.addPod(nsA, "sbxbench", testNow, nil)
	e.cached(nsA, "sbxbench", podReady)
	pod, _ := e.gw.pods.get(nsA, "sbxbench")
	token := e.gw.cfg.Tokens.New(nsA, "sbxbench")
	for b.Loop() {
		if e.gw.tokenCheck(pod, "sbxbench", token) != tokenMatches {
			b.Fatal("the pod's own token was refused")
		}
	}
}

//go:build e2e

package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandman-dev/sandman/daemon/api"
	daemonclient "github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/podcontract"
)

// sandboxHeaders sends every request to one sandbox through the gateway
// (E2B_SANDBOX_URL mode).
type sandboxHeaders struct {
	id string
}

func (h sandboxHeaders) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("E2b-Sandbox-Id", h.id)
	r.Header.Set("E2b-Sandbox-Port", "49983")
	return http.DefaultTransport.RoundTrip(r)
}

// daemonVia is a daemon client for sandbox sb through the gateway.
func (g *tenantGateway) daemonVia(t *testing.T, sb e2bSandbox) *daemonclient.Client {
	t.Helper()
	c, err := daemonclient.New(g.url, daemonclient.WithToken(sb.EnvdAccessToken),
		daemonclient.WithHTTPClient(&http.Client{Transport: sandboxHeaders{id: sb.SandboxID}}))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// portGET is a request for port of sandbox id through the gateway, with
// traffic token tok ("" for none).
func (g *tenantGateway) portGET(t *testing.T, id string, port int, tok, path string) (int, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, g.url+path, nil)
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(port))
	if tok != "" {
		req.Header.Set("E2b-Traffic-Access-Token", tok)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("port %d of %s: %v", port, id, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// portImpostor is the live recipe of issue 41: tenant A's private sandbox
// serves on a port; tenant B, in its own namespace, runs a public pod
// named after A's sandbox, with the gateway's labels, serving on the same
// port. Every request carrying A's traffic token is answered by A's
// sandbox (before, 36 of 40 reached B's pod), and a tokenless one is
// refused, not answered by B's.
func portImpostor(t *testing.T, s *framework.Stack, p *vpool, g *tenantGateway, a, b tenant) {
	ctx := t.Context()
	const port = 8080
	sb := g.create(t, a.key, s.DebianImage, map[string]any{"network": map[string]any{"allowPublicTraffic": false}})
	if sb.TrafficAccessToken == "" {
		t.Fatal("a private sandbox without a traffic token")
	}
	if _, err := g.daemonVia(t, sb).StartProcess(ctx, api.ProcessRequest{Shell: "mkdir -p /tmp/www && echo tenant-a > /tmp/www/who && exec python3 -m http.server " +
		strconv.Itoa(port) + " -d /tmp/www"}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 30*time.Second, "tenant A's web server to answer through the gateway", func(context.Context) (bool, error) {
		code, body := g.portGET(t, sb.SandboxID, port, sb.TrafficAccessToken, "/who")
		return code == http.StatusOK && strings.TrimSpace(body) == "tenant-a", nil
	})
	podA, err := s.Kube.CoreV1().Pods(a.ns).Get(ctx, sb.SandboxID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ann := map[string]string{}
	for k, v := range podA.Annotations {
		ann[k] = v
	}
	delete(ann, podcontract.AnnotationE2BPublicTraffic) // public: its port takes anyone
	ann[podcontract.AnnotationTokenSHA256] = strings.Repeat("ab", 32)
	impostor := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: sb.SandboxID, Namespace: b.ns, Labels: podA.Labels, Annotations: ann},
		Spec: corev1.PodSpec{NodeName: s.Env["WORKER_NAME"], TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{Name: "c", Image: s.BusyboxImage,
				Command: []string{"sh", "-c", "mkdir -p /w && echo impostor > /w/who && exec httpd -f -p " + strconv.Itoa(port) + " -h /w"}}}},
	}
	if _, err := s.Kube.CoreV1().Pods(b.ns).Create(ctx, impostor, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = s.Kube.CoreV1().Pods(b.ns).Delete(context.WithoutCancel(ctx), impostor.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)})
	}()
	imp := p.waitPodIn(b.ns, impostor.Name, 2*time.Minute, "Running with an address", func(pod *corev1.Pod) bool {
		return pod.Status.Phase == corev1.PodRunning && pod.Status.PodIP != "" && podReady(pod)
	})
	// The impostor serves: a request that reached it would say so.
	framework.Eventually(t, 30*time.Second, "the impostor's web server to answer directly", func(ctx context.Context) (bool, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+imp.Status.PodIP+":"+strconv.Itoa(port)+"/who", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, nil
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return strings.TrimSpace(string(body)) == "impostor", nil
	})
	byWhom := map[string]int{}
	for range 40 {
		code, body := g.portGET(t, sb.SandboxID, port, sb.TrafficAccessToken, "/who")
		byWhom[strconv.Itoa(code)+" "+strings.TrimSpace(body)]++
	}
	if byWhom["200 tenant-a"] != 40 {
		t.Errorf("40 requests carrying A's traffic token were answered: %v; want all by tenant A's sandbox", byWhom)
	}
	if code, body := g.portGET(t, sb.SandboxID, port, "", "/who"); code != http.StatusForbidden || strings.Contains(body, "impostor") {
		t.Errorf("a tokenless request for A's private sandbox: %d %q, want 403", code, body)
	}
}

// buildOutputBounded is the other live recipe: a template build whose step
// prints millions of empty lines leaves the gateway's memory where it was
// (before, RUN yes ” grew it from 32 MB to 2.7 GB in 25 s). The build
// fails as its step does, and its logs say how much output was not kept.
func buildOutputBounded(t *testing.T, s *framework.Stack, g *tenantGateway, a tenant) {
	var req struct {
		TemplateID string `json:"templateID"`
		BuildID    string `json:"buildID"`
	}
	if code, body := g.call(t, a.key, http.MethodPost, "/v3/templates", map[string]any{"name": "empty-lines"}, &req); code != http.StatusAccepted {
		t.Fatalf("request a build: %d %s", code, body)
	}
	const lines = 4_000_000
	start := map[string]any{"fromImage": s.DebianImage, "steps": []map[string]any{
		{"type": "RUN", "args": []string{"yes '' | head -n " + strconv.Itoa(lines) + "; exit 3"}},
	}}
	if code, body := g.call(t, a.key, http.MethodPost, "/v2/templates/"+req.TemplateID+"/builds/"+req.BuildID, start, nil); code != http.StatusAccepted {
		t.Fatalf("start the build: %d %s", code, body)
	}
	var st struct {
		Status string `json:"status"`
		Reason *struct {
			Message string `json:"message"`
		} `json:"reason"`
		LogEntries []struct {
			Message string `json:"message"`
		} `json:"logEntries"`
	}
	framework.Eventually(t, 3*time.Minute, "the build to end", func(context.Context) (bool, error) {
		st.LogEntries = nil
		if code, body := g.call(t, a.key, http.MethodGet, "/templates/"+req.TemplateID+"/builds/"+req.BuildID+"/status", nil, &st); code != http.StatusOK {
			t.Fatalf("build status: %d %s", code, body)
		}
		return st.Status == "ready" || st.Status == "error", nil
	})
	if st.Status != "error" || st.Reason == nil || !strings.Contains(st.Reason.Message, "exit code 3") {
		t.Errorf("build ended %s (%+v), want error with the step's exit code 3", st.Status, st.Reason)
	}
	if n := len(st.LogEntries); n == 0 || n > 20000 || !strings.Contains(st.LogEntries[n-1].Message, "were not kept") {
		t.Errorf("%d log entries kept of %d lines; the last should say what was not kept", n, lines)
	}
	peak := vmHWM(t, g.proc.cmd.Process.Pid)
	t.Logf("the gateway's peak RSS after a build printing %d empty lines: %d MiB, %d log entries kept", lines, peak>>20, len(st.LogEntries))
	if peak > 200<<20 {
		t.Errorf("the gateway's peak RSS is %d MiB: the build's output is held", peak>>20)
	}
}

// vmHWM is a process's peak resident set size, in bytes.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmHWM in /proc/" + strconv.Itoa(pid) + "/status")
	return 0
}

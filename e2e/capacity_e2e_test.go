//go:build e2e

package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/utils/ptr"

	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
)

// startPrometheus runs Debian's Prometheus scraping targets every second
// and returns its address.
func startPrometheus(t *testing.T, targets ...string) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatal("prometheus not installed (hack/install-deps.sh installs Debian's package)")
	}
	dir := t.TempDir()
	quoted := make([]string, len(targets))
	for i, tg := range targets {
		quoted[i] = strconv.Quote(tg)
	}
	cfg := fmt.Sprintf("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: sandman\n    static_configs:\n      - targets: [%s]\n",
		strings.Join(quoted, ", "))
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	a := startProcess(t, "prometheus", bin, "--config.file="+filepath.Join(dir, "prometheus.yml"),
		"--storage.tsdb.path="+filepath.Join(dir, "data"), "--web.listen-address="+addr, "--log.level=warn")
	_ = a
	framework.Eventually(t, time.Minute, "prometheus to scrape every target", func(ctx context.Context) (bool, error) {
		var res struct {
			Data struct {
				ActiveTargets []struct {
					Health string `json:"health"`
				} `json:"activeTargets"`
			} `json:"data"`
		}
		if err := getJSON(ctx, "http://"+addr+"/api/v1/targets", &res); err != nil {
			return false, nil
		}
		up := 0
		for _, tg := range res.Data.ActiveTargets {
			if tg.Health == "up" {
				up++
			}
		}
		return up == len(targets), nil
	})
	return addr
}

// startProcess runs a helper program for the test's duration.
func startProcess(t *testing.T, name, bin string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(bin, args...)
	out := &strings.Builder{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, out.String())
		}
	})
	return cmd
}

func getJSON(ctx context.Context, u string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: %s: %s", u, resp.Status, b)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// dashboardExprs reads every PromQL expression of the Grafana dashboard,
// with the dashboard's variables given values as Grafana would: every node,
// a 1-minute rate window, a 1-hour range.
func dashboardExprs(t *testing.T, root string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "deploy", "base", "grafana", "sandman-capacity.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Type    string `json:"type"`
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	vars := strings.NewReplacer(`$node`, `.*`, `$__rate_interval`, `1m`, `$__range`, `1h`)
	out := map[string]string{}
	for _, p := range dash.Panels {
		for i, tg := range p.Targets {
			out[fmt.Sprintf("%s [%c]", p.Title, 'A'+i)] = vars.Replace(tg.Expr)
		}
	}
	if len(out) < 20 {
		t.Fatalf("only %d expressions in the dashboard", len(out))
	}
	return out
}

// TestDashboardQueriesReturnData: a real Prometheus scrapes sandman-vk and
// two node agents while a small burst runs (sandboxes, one with a deadline
// that reclaims it, one with a missing image, a pre-pull), and every
// expression of the Grafana dashboard returns data from Prometheus's HTTP
// API.
func TestDashboardQueriesReturnData(t *testing.T) {
	s := framework.Get(t)
	p := startPool(t, s, 2, 6)
	prom := startPrometheus(t, p.metrics, p.agents[0].addr, p.agents[1].addr)
	exprs := dashboardExprs(t, s.Root)

	// The burst.
	for i := range 6 {
		p.create(p.newPod(fmt.Sprintf("burst-%d", i), s.BusyboxImage))
	}
	p.create(p.newPod("deadline", s.BusyboxImage, func(pod *corev1.Pod) { pod.Spec.ActiveDeadlineSeconds = ptr.To[int64](2) }))
	p.create(p.newPod("missing", s.Registry+"/sandman-test/missing:"+rand.String(6)))
	for _, a := range p.agents {
		if err := a.client.PrePull(t.Context(), []string{s.DebianImage}); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 6 {
		p.waitPod(fmt.Sprintf("burst-%d", i), 2*time.Minute, "Ready", podReady)
	}
	p.waitPod("deadline", time.Minute, "DeadlineExceeded", func(pod *corev1.Pod) bool {
		return pod.Status.Phase == corev1.PodFailed && pod.Status.Reason == "DeadlineExceeded"
	})

	pending := map[string]string{}
	for k, v := range exprs {
		pending[k] = v
	}
	deadline := time.Now().Add(90 * time.Second)
	for len(pending) > 0 && time.Now().Before(deadline) {
		for title, expr := range pending {
			var res struct {
				Status string `json:"status"`
				Data   struct {
					Result []json.RawMessage `json:"result"`
				} `json:"data"`
			}
			if err := getJSON(t.Context(), "http://"+prom+"/api/v1/query?query="+url.QueryEscape(expr), &res); err != nil {
				t.Fatalf("%s: %s: %v", title, expr, err)
			}
			if res.Status == "success" && len(res.Data.Result) > 0 {
				delete(pending, title)
			}
		}
		if len(pending) > 0 {
			time.Sleep(2 * time.Second) // the next scrapes; a deadline bounds the loop
		}
	}
	for title, expr := range pending {
		t.Errorf("no data for %q: %s", title, expr)
	}
	t.Logf("%d dashboard expressions return data", len(exprs)-len(pending))
}

// chromium renders url headless and returns the DOM after the page's
// scripts ran for budget (virtual time), and, with png set, a screenshot.
func chromium(t *testing.T, u string, budget time.Duration, png string) string {
	t.Helper()
	bin, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatal("chromium not installed (hack/install-deps.sh installs Debian's package)")
	}
	args := []string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
		"--disable-background-networking", "--disable-component-update", "--disable-sync",
		"--user-data-dir=" + t.TempDir(), "--virtual-time-budget=" + strconv.Itoa(int(budget.Milliseconds())),
		"--window-size=1600,1000"}
	if png != "" {
		args = append(args, "--screenshot="+png)
	} else {
		args = append(args, "--dump-dom")
	}
	out, errOut, code := runCommand(t, 2*time.Minute, nil, "", bin, append(args, u)...)
	if code != 0 {
		t.Fatalf("chromium %s: exit %d: %s", u, code, errOut)
	}
	return out
}

var (
	cellRE  = regexp.MustCompile(`data-node="([^"]+)" data-field="(\w+)"[^>]*>([^<]*)<`)
	totalRE = regexp.MustCompile(`data-total="(\w+)"[^>]*>([^<]*)<`)
)

// pageNumbers reads the capacity page's per-node cells and totals.
type pageNumbers struct {
	cells  map[string]map[string]string // node → field → text
	totals map[string]string
}

func parsePage(dom string) pageNumbers {
	p := pageNumbers{cells: map[string]map[string]string{}, totals: map[string]string{}}
	for _, m := range cellRE.FindAllStringSubmatch(dom, -1) {
		if p.cells[m[1]] == nil {
			p.cells[m[1]] = map[string]string{}
		}
		p.cells[m[1]][m[2]] = strings.TrimSpace(m[3])
	}
	for _, m := range totalRE.FindAllStringSubmatch(dom, -1) {
		p.totals[m[1]] = strings.TrimSpace(m[2])
	}
	return p
}

// artifactDir is where tests leave files for people to look at.
func artifactDir(t *testing.T) string {
	dir := os.Getenv("SANDMAN_TEST_ARTIFACTS")
	if dir == "" {
		dir = filepath.Join(framework.StateDir(), "test-artifacts")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestCapacityPageInChromium: the capacity page, rendered by headless
// Chromium from sandman-vk, shows each worker's bound and warm slots as the
// node agents report them, and the pool's totals; it stays right while
// sandboxes come and go, refreshes itself, and shows a node agent that went
// away as unhealthy within seconds, its capacity gone from the totals (and
// from the metrics).
func TestCapacityPageInChromium(t *testing.T) {
	s := framework.Get(t)
	p := startPool(t, s, 2, 4)
	page := "http://" + p.metrics + "/capacity"

	// The page matches the agents: checked until the inventories and the
	// page agree (both move while the refiller works).
	matches := func(what string, wantBound int) pageNumbers {
		var last pageNumbers
		var why string
		framework.Eventually(t, time.Minute, "the page to show "+what, func(ctx context.Context) (bool, error) {
			want := map[string]runtime.Inventory{}
			totalBound, totalWarm, totalCap := 0, 0, 0
			for _, a := range p.agents {
				inv, err := a.client.Inventory(ctx)
				if err != nil {
					return false, err
				}
				want[a.name] = inv
				totalBound += inv.Count()[runtime.StateBound]
				totalWarm += inv.Count()[runtime.StateWarm]
				totalCap += inv.Capacity.Slots
			}
			last = parsePage(chromium(t, page, 3*time.Second, ""))
			for name, inv := range want {
				c := last.cells[name]
				for field, n := range map[string]int{"warm": inv.Count()[runtime.StateWarm], "bound": inv.Count()[runtime.StateBound],
					"hot": inv.Count()[runtime.StateHot]} {
					if c[field] != strconv.Itoa(n) {
						why = fmt.Sprintf("%s %s: page %q, agent %d", name, field, c[field], n)
						return false, nil
					}
				}
				if c["health"] != "healthy" {
					why = name + " not healthy on the page"
					return false, nil
				}
			}
			for field, n := range map[string]int{"bound": totalBound, "warm": totalWarm, "capacity_slots": totalCap} {
				if last.totals[field] != strconv.Itoa(n) {
					why = fmt.Sprintf("total %s: page %q, agents %d", field, last.totals[field], n)
					return false, nil
				}
			}
			if totalBound != wantBound {
				why = fmt.Sprintf("agents report %d bound, want %d", totalBound, wantBound)
				return false, nil
			}
			return true, nil
		})
		if t.Failed() {
			t.Logf("last mismatch: %s", why)
		}
		return last
	}

	for i := range 3 {
		p.create(p.newPod(fmt.Sprintf("page-%d", i), s.BusyboxImage))
	}
	for i := range 3 {
		p.waitPod(fmt.Sprintf("page-%d", i), 2*time.Minute, "Ready", podReady)
	}
	matches("3 bound sandboxes", 3)

	shot := filepath.Join(artifactDir(t), "capacity-page.png")
	chromium(t, page, 3*time.Second, shot)
	if fi, err := os.Stat(shot); err != nil || fi.Size() < 10_000 {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
	t.Logf("screenshot: %s", shot)

	// The page refreshes itself.
	dom := chromium(t, page, 7*time.Second, "")
	m := regexp.MustCompile(`data-refreshes="(\d+)"`).FindStringSubmatch(dom)
	if m == nil {
		t.Fatal("the page never loaded its data")
	}
	if n, _ := strconv.Atoi(m[1]); n < 3 {
		t.Fatalf("the page refreshed %d times in 7 s; want it to refresh itself every 2 s", n)
	}

	// Sandboxes come and go.
	for _, name := range []string{"page-0", "page-1"} {
		if err := s.Kube.CoreV1().Pods(p.ns).Delete(t.Context(), name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
			t.Fatal(err)
		}
	}
	p.create(p.newPod("page-3", s.BusyboxImage))
	p.waitPod("page-3", 2*time.Minute, "Ready", podReady)
	matches("2 bound sandboxes after deletes and a create", 2)

	// A node agent goes away.
	gone := p.agents[1]
	if err := gone.proc.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-gone.proc.done
	stayed := p.agents[0]
	inv, err := stayed.client.Inventory(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	framework.Eventually(t, 30*time.Second, gone.name+" unhealthy on the page and in the metrics", func(ctx context.Context) (bool, error) {
		pg := parsePage(chromium(t, page, 3*time.Second, ""))
		if pg.cells[gone.name]["health"] != "unhealthy" || pg.totals["capacity_slots"] != strconv.Itoa(inv.Capacity.Slots) ||
			pg.totals["healthy_nodes"] != "1" {
			return false, nil
		}
		metrics, err := scrape(ctx, "http://"+p.metrics+"/metrics")
		if err != nil {
			return false, nil
		}
		return strings.Contains(metrics, fmt.Sprintf("sandman_pool_node_healthy{node=%q} 0", gone.name)) &&
			strings.Contains(metrics, fmt.Sprintf("sandman_pool_node_capacity_slots{node=%q} 0", gone.name)), nil
	})
	t.Logf("%s shown unhealthy %s after its kill", gone.name, time.Since(begin).Round(100*time.Millisecond))
	shot = filepath.Join(artifactDir(t), "capacity-page-node-down.png")
	chromium(t, page, 3*time.Second, shot)
	t.Logf("screenshot: %s", shot)

	// It comes back (and tears its slots down when the test ends).
	gone.restart(t)
	framework.Eventually(t, time.Minute, gone.name+" healthy again on the page", func(ctx context.Context) (bool, error) {
		return parsePage(chromium(t, page, 3*time.Second, "")).cells[gone.name]["health"] == "healthy", nil
	})
	// What it still held for pods reported lost meanwhile is released.
	p.waitOnlyLiveBound()
}

func scrape(ctx context.Context, u string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

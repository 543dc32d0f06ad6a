package gateway

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	vkapi "github.com/sandman-dev/sandman/vk/api"
)

// fakeUsage is a virtual node's usage route: samples by pod, filtered as
// the virtual node filters them.
type fakeUsage struct {
	mu      sync.Mutex
	samples map[string][]vkapi.UsageSample // namespace/pod → samples
	asked   []vkapi.UsageRequest
	nodes   []string
	fail    error
}

func (f *fakeUsage) usage(_ context.Context, node string, req vkapi.UsageRequest) (vkapi.UsageResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked, f.nodes = append(f.asked, req), append(f.nodes, node)
	if f.fail != nil {
		return vkapi.UsageResponse{}, f.fail
	}
	var out vkapi.UsageResponse
	for _, pod := range req.Pods {
		all, ok := f.samples[req.Namespace+"/"+pod]
		if !ok {
			continue
		}
		pu := vkapi.PodUsage{Namespace: req.Namespace, Pod: pod}
		for _, s := range all {
			if (!req.Start.IsZero() && s.Time.Before(req.Start)) || (!req.End.IsZero() && s.Time.After(req.End)) {
				continue
			}
			pu.Samples = append(pu.Samples, s)
		}
		if req.Latest && len(pu.Samples) > 1 {
			pu.Samples = pu.Samples[len(pu.Samples)-1:]
		}
		out.Pods = append(out.Pods, pu)
	}
	return out, nil
}

// onNode puts a sandbox's pod on a virtual node, as the scheduler would.
func (e *env) onNode(ns, name, node string) {
	e.t.Helper()
	pod, err := e.client.CoreV1().Pods(ns).Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	pod.Spec.NodeName = node
	if _, err := e.client.CoreV1().Pods(ns).Update(context.Background(), pod, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// TestSandboxMetrics: getMetrics reads the samples of the sandbox's
// virtual node in E2B's shape, within start and end; another key's
// sandbox is not found; bad ranges are refused.
func TestSandboxMetrics(t *testing.T) {
	f := &fakeUsage{samples: map[string][]vkapi.UsageSample{}}
	e := newEnv(t, func(c *Config) { c.Usage = f.usage })
	sb, pod := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base"})
	e.onNode(nsA, pod.Name, "vnode-1")
	t0 := time.Unix(1_764_000_000, 0).UTC()
	for i := range 3 {
		f.samples[nsA+"/"+sb.SandboxID] = append(f.samples[nsA+"/"+sb.SandboxID], vkapi.UsageSample{
			Time: t0.Add(time.Duration(i) * 5 * time.Second), CPUCount: 2, CPUUsedPct: float64(10 * (i + 1)),
			MemoryBytes: 100 << 20, MemoryLimitBytes: 1 << 30, DiskBytes: 5 << 20, DiskLimitBytes: 10 << 30,
		})
	}

	r := e.call(http.MethodGet, "/sandboxes/"+sb.SandboxID+"/metrics", rawKeyA, nil)
	var got []sandboxMetric
	r.decode(t, &got)
	if r.status != http.StatusOK || len(got) != 3 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	want := sandboxMetric{Timestamp: t0, TimestampUnix: t0.Unix(), CPUCount: 2, CPUUsedPct: 10,
		MemUsed: 100 << 20, MemTotal: 1 << 30, DiskUsed: 5 << 20, DiskTotal: 10 << 30}
	if got[0] != want || got[2].CPUUsedPct != 30 {
		t.Fatalf("got %+v, want first %+v", got, want)
	}
	if f.nodes[0] != "vnode-1" || f.asked[0].Namespace != nsA || f.asked[0].Pods[0] != sb.SandboxID {
		t.Fatalf("asked %+v on %v", f.asked, f.nodes)
	}
	// The SDK's raw body: timestamp as RFC 3339, the unix one beside it.
	if !strings.Contains(string(r.body), `"timestamp":"`+t0.Format(time.RFC3339)+`"`) || !strings.Contains(string(r.body), `"timestampUnix":1764000000`) {
		t.Fatalf("body %s", r.body)
	}

	r = e.call(http.MethodGet, "/sandboxes/"+sb.SandboxID+"/metrics?start=1764000005&end=1764000009", rawKeyA, nil)
	r.decode(t, &got)
	if r.status != http.StatusOK || len(got) != 1 || got[0].CPUUsedPct != 20 {
		t.Fatalf("range: %d %s", r.status, r.body)
	}

	for _, tc := range []struct {
		name, path, key string
		status          int
		want            string
	}{
		{"another key's sandbox", "/sandboxes/" + sb.SandboxID + "/metrics", rawKeyB, http.StatusNotFound, "not found"},
		{"no such sandbox", "/sandboxes/nosuchsandbox/metrics", rawKeyA, http.StatusNotFound, "not found"},
		{"bad start", "/sandboxes/" + sb.SandboxID + "/metrics?start=yesterday", rawKeyA, http.StatusBadRequest, "start \"yesterday\": want Unix seconds"},
		{"negative end", "/sandboxes/" + sb.SandboxID + "/metrics?end=-5", rawKeyA, http.StatusBadRequest, "end \"-5\""},
		{"end before start", "/sandboxes/" + sb.SandboxID + "/metrics?start=20&end=10", rawKeyA, http.StatusBadRequest, "end 10 is before start 20"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.call(http.MethodGet, tc.path, tc.key, nil)
			if r.status != tc.status || !strings.Contains(r.apiError(t).Message, tc.want) {
				t.Fatalf("%d %s", r.status, r.body)
			}
		})
	}

	// The virtual node not answering is the gateway's failure, said.
	f.fail = &vkapi.Error{Code: vkapi.CodeUnavailable, Message: "node vnode-1 did not answer"}
	r = e.call(http.MethodGet, "/sandboxes/"+sb.SandboxID+"/metrics", rawKeyA, nil)
	if r.status != http.StatusServiceUnavailable || !strings.Contains(r.apiError(t).Message, "did not answer") {
		t.Fatalf("node down: %d %s", r.status, r.body)
	}
	f.fail = errors.New("forbidden: nodes/proxy get")
	r = e.call(http.MethodGet, "/sandboxes/"+sb.SandboxID+"/metrics", rawKeyA, nil)
	if r.status != http.StatusInternalServerError || !strings.Contains(r.apiError(t).Message, "nodes/proxy") {
		t.Fatalf("refused: %d %s", r.status, r.body)
	}
}

// TestSandboxesMetrics: GET /sandboxes/metrics answers the newest sample of
// each of the key's running sandboxes named, one call per virtual node;
// others' and unknown ones are left out.
func TestSandboxesMetrics(t *testing.T) {
	f := &fakeUsage{samples: map[string][]vkapi.UsageSample{}}
	e := newEnv(t, func(c *Config) { c.Usage = f.usage })
	t0 := time.Unix(1_764_000_000, 0).UTC()
	var ids []string
	for i, node := range []string{"vn-1", "vn-1", "vn-2"} {
		sb, pod := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base"})
		e.onNode(nsA, pod.Name, node)
		ids = append(ids, sb.SandboxID)
		f.samples[nsA+"/"+sb.SandboxID] = []vkapi.UsageSample{
			{Time: t0, CPUCount: 1, CPUUsedPct: 1},
			{Time: t0.Add(5 * time.Second), CPUCount: 1, CPUUsedPct: float64(50 + i), MemoryBytes: 7 << 20},
		}
	}
	other, otherPod := e.createReady(rawKeyB, nsB, map[string]any{"templateID": "base"})
	e.onNode(nsB, otherPod.Name, "vn-1")
	f.samples[nsB+"/"+other.SandboxID] = []vkapi.UsageSample{{Time: t0, CPUUsedPct: 99}}
	for _, id := range ids {
		e.cached(nsA, id, func(p *corev1.Pod) bool { return p.Spec.NodeName != "" })
	}

	q := "/sandboxes/metrics?sandbox_ids=" + strings.Join(append(ids, other.SandboxID, "nosuchsandbox"), ",")
	r := e.call(http.MethodGet, q, rawKeyA, nil)
	var got sandboxesWithMetrics
	r.decode(t, &got)
	if r.status != http.StatusOK || len(got.Sandboxes) != 3 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	for i, id := range ids {
		if m := got.Sandboxes[id]; m.CPUUsedPct != float64(50+i) || m.MemUsed != 7<<20 || !m.Timestamp.Equal(t0.Add(5*time.Second)) {
			t.Fatalf("%s: %+v", id, m)
		}
	}
	if len(f.asked) != 2 {
		t.Fatalf("%d calls to virtual nodes, want one per node: %+v", len(f.asked), f.asked)
	}
	for _, a := range f.asked {
		if !a.Latest || a.Namespace != nsA {
			t.Fatalf("asked %+v", a)
		}
	}

	for _, tc := range []struct{ name, path, want string }{
		{"none", "/sandboxes/metrics", "sandbox_ids is required"},
		{"too many", "/sandboxes/metrics?sandbox_ids=" + manyIDs(101), "more than the 100 allowed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := e.call(http.MethodGet, tc.path, rawKeyA, nil)
			if r.status != http.StatusBadRequest || !strings.Contains(r.apiError(t).Message, tc.want) {
				t.Fatalf("%d %s", r.status, r.body)
			}
		})
	}
}

func manyIDs(n int) string {
	var s []string
	for i := range n {
		s = append(s, fmt.Sprintf("sb%d", i))
	}
	return strings.Join(s, ",")
}

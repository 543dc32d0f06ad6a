package vk

import (
	"context"
	"errors"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	statsv1alpha1 "k8s.io/kubelet/pkg/apis/stats/v1alpha1"

	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/fake"
)

// scrape serves metric families as virtual-kubelet's /metrics/resource
// handler does and parses the text as a scraper would.
func scrape(t *testing.T, fams []*dto.MetricFamily) map[string]*dto.MetricFamily {
	t.Helper()
	rec := httptest.NewRecorder()
	api.HandlePodMetricsResource(func(context.Context) ([]*dto.MetricFamily, error) { return fams, nil })(rec, httptest.NewRequest("GET", "/metrics/resource", nil))
	if rec.Code != 200 {
		t.Fatalf("/metrics/resource: %d %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("content type %q", ct)
	}
	parser := expfmt.NewTextParser(model.LegacyValidation)
	out, err := parser.TextToMetricFamilies(strings.NewReader(rec.Body.String()))
	if err != nil {
		t.Fatalf("parse: %v\n%s", err, rec.Body)
	}
	return out
}

// labelsOf renders a sample's labels as name=value pairs in order.
func labelsOf(m *dto.Metric) string {
	var s []string
	for _, l := range m.Label {
		s = append(s, l.GetName()+"="+l.GetValue())
	}
	return strings.Join(s, ",")
}

// find returns the sample of a family with exactly these labels.
func find(fams map[string]*dto.MetricFamily, name, labels string) *dto.Metric {
	for _, m := range fams[name].GetMetric() {
		if labelsOf(m) == labels {
			return m
		}
	}
	return nil
}

func value(m *dto.Metric) float64 {
	if m.Counter != nil {
		return m.Counter.GetValue()
	}
	return m.Gauge.GetValue()
}

func TestResourceMetricsAsMetricsServerReadsThem(t *testing.T) {
	at := time.UnixMilli(1_700_000_000_123)
	started := time.Unix(1_699_999_000, 0)
	u64 := func(v uint64) *uint64 { return &v }
	full := func() *statsv1alpha1.Summary {
		cpu := &statsv1alpha1.CPUStats{Time: metav1.NewTime(at), UsageCoreNanoSeconds: u64(2_500_000_000)}
		mem := &statsv1alpha1.MemoryStats{Time: metav1.NewTime(at), WorkingSetBytes: u64(100 << 20)}
		return &statsv1alpha1.Summary{
			Node: statsv1alpha1.NodeStats{NodeName: "vn",
				CPU:    &statsv1alpha1.CPUStats{Time: metav1.NewTime(at), UsageCoreNanoSeconds: u64(12_500_000_000)},
				Memory: &statsv1alpha1.MemoryStats{Time: metav1.NewTime(at), WorkingSetBytes: u64(300 << 20)}},
			Pods: []statsv1alpha1.PodStats{
				{PodRef: statsv1alpha1.PodReference{Namespace: "ns", Name: "a", UID: "ua"}, StartTime: metav1.NewTime(started), CPU: cpu, Memory: mem,
					Containers: []statsv1alpha1.ContainerStats{{Name: "task", StartTime: metav1.NewTime(started), CPU: cpu, Memory: mem}}},
				// Not running yet: no figures, no series.
				{PodRef: statsv1alpha1.PodReference{Namespace: "ns", Name: "b", UID: "ub"}},
			},
		}
	}
	empty := &statsv1alpha1.Summary{Node: statsv1alpha1.NodeStats{NodeName: "vn",
		CPU:    &statsv1alpha1.CPUStats{Time: metav1.NewTime(at), UsageCoreNanoSeconds: u64(0)},
		Memory: &statsv1alpha1.MemoryStats{Time: metav1.NewTime(at), WorkingSetBytes: u64(0)}}}

	type want struct {
		name, labels string
		typ          dto.MetricType
		value        float64
		stamped      bool // a timestamp (the reading's, in ms)
	}
	const ctr = "container=task,namespace=ns,pod=a"
	const pod = "namespace=ns,pod=a"
	for _, tc := range []struct {
		name    string
		summary *statsv1alpha1.Summary
		failed  int
		want    []want
	}{
		{"running sandbox", full(), 0, []want{
			{"node_cpu_usage_seconds_total", "", dto.MetricType_COUNTER, 12.5, true},
			{"node_memory_working_set_bytes", "", dto.MetricType_GAUGE, 300 << 20, true},
			{"container_cpu_usage_seconds_total", ctr, dto.MetricType_COUNTER, 2.5, true},
			{"container_memory_working_set_bytes", ctr, dto.MetricType_GAUGE, 100 << 20, true},
			{"container_start_time_seconds", ctr, dto.MetricType_GAUGE, float64(started.Unix()), false},
			{"pod_cpu_usage_seconds_total", pod, dto.MetricType_COUNTER, 2.5, true},
			{"pod_memory_working_set_bytes", pod, dto.MetricType_GAUGE, 100 << 20, true},
			{"scrape_error", "", dto.MetricType_GAUGE, 0, false},
			{"resource_scrape_error", "", dto.MetricType_GAUGE, 0, false},
		}},
		{"a reading failed", full(), 1, []want{
			{"scrape_error", "", dto.MetricType_GAUGE, 1, false},
			{"resource_scrape_error", "", dto.MetricType_GAUGE, 1, false},
		}},
		{"no sandboxes", empty, 0, []want{
			{"node_cpu_usage_seconds_total", "", dto.MetricType_COUNTER, 0, true},
			{"node_memory_working_set_bytes", "", dto.MetricType_GAUGE, 0, true},
			{"scrape_error", "", dto.MetricType_GAUGE, 0, false},
			{"resource_scrape_error", "", dto.MetricType_GAUGE, 0, false},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fams := scrape(t, resourceMetrics(tc.summary, tc.failed))
			for _, w := range tc.want {
				f := fams[w.name]
				if f == nil {
					t.Fatalf("no %s in %v", w.name, keys(fams))
				}
				if f.GetType() != w.typ || !strings.HasPrefix(f.GetHelp(), "[STABLE] ") && !strings.HasPrefix(f.GetHelp(), "[ALPHA] ") {
					t.Errorf("%s: type %s help %q", w.name, f.GetType(), f.GetHelp())
				}
				m := find(fams, w.name, w.labels)
				switch {
				case m == nil:
					t.Errorf("%s{%s}: missing; have %d samples", w.name, w.labels, len(f.GetMetric()))
				case value(m) != w.value:
					t.Errorf("%s{%s} = %v, want %v", w.name, w.labels, value(m), w.value)
				case w.stamped && m.GetTimestampMs() != at.UnixMilli():
					t.Errorf("%s{%s}: timestamp %d, want %d", w.name, w.labels, m.GetTimestampMs(), at.UnixMilli())
				case !w.stamped && m.TimestampMs != nil:
					t.Errorf("%s{%s}: timestamp %d, want none (as the kubelet)", w.name, w.labels, m.GetTimestampMs())
				}
			}
			// Only the running sandbox has series; b has none.
			for name, f := range fams {
				for _, m := range f.GetMetric() {
					if strings.Contains(labelsOf(m), "pod=b") {
						t.Errorf("%s has a series for the pending pod: %s", name, labelsOf(m))
					}
				}
			}
			if tc.summary == empty {
				if len(fams) != 4 {
					t.Errorf("families without samples were written: %v", keys(fams))
				}
			}
		})
	}
}

func keys(m map[string]*dto.MetricFamily) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// cpuNode is a fake node agent whose sandboxes use the CPU time the test
// sets, and whose stats calls fail for the pods the test says.
type cpuNode struct {
	*fake.Runtime

	// mu guards cpu and fail (by pod UID).
	mu   sync.Mutex
	cpu  map[string]uint64
	fail map[string]bool
}

func (n *cpuNode) Stats(ctx context.Context, uid string) (runtime.Stats, error) {
	st, err := n.Runtime.Stats(ctx, uid)
	if err != nil {
		return st, err
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.fail[uid] {
		return runtime.Stats{}, errors.New("node agent did not answer")
	}
	st.CPUUsageNanos = n.cpu[uid]
	return st, nil
}

func (n *cpuNode) set(uid string, seconds float64, fail bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.cpu[uid], n.fail[uid] = uint64(seconds*1e9), fail
}

// TestStatsFromTheNodeAgents: the sandboxes' figures reach /metrics/resource
// and /stats/summary as their first container's and their pod's, the node's
// CPU counter never goes down when a sandbox ends or does not answer, and a
// failed reading shows as scrape_error.
func TestStatsFromTheNodeAgents(t *testing.T) {
	node := &cpuNode{cpu: map[string]uint64{}, fail: map[string]bool{}}
	h := newHarnessWith(t, 4, func(f *fake.Runtime) runtime.Runtime {
		node.Runtime = f
		return node
	})
	a, b := testPod("a", "img"), testPod("b", "img")
	for _, pod := range []*corev1.Pod{a, b} {
		if err := h.p.CreatePod(t.Context(), pod); err != nil {
			t.Fatal(err)
		}
		h.wait(t, pod.UID, pod.Name+" Ready", isReady)
	}
	metrics := func() map[string]*dto.MetricFamily {
		t.Helper()
		fams, err := h.p.GetMetricsResource(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return scrape(t, fams)
	}
	check := func(step string, fams map[string]*dto.MetricFamily, name, labels string, want float64) {
		t.Helper()
		m := find(fams, name, labels)
		switch {
		case m == nil && want >= 0:
			t.Fatalf("%s: %s{%s} missing", step, name, labels)
		case m != nil && want < 0:
			t.Fatalf("%s: %s{%s} = %v, want no series", step, name, labels, value(m))
		case m != nil && value(m) != want:
			t.Fatalf("%s: %s{%s} = %v, want %v", step, name, labels, value(m), want)
		}
	}
	const none = -1

	node.set("uid-a", 2, false)
	node.set("uid-b", 3, false)
	fams := metrics()
	check("two sandboxes", fams, "node_cpu_usage_seconds_total", "", 5)
	check("two sandboxes", fams, "node_memory_working_set_bytes", "", 8<<20) // the fake's 4 MiB each
	check("two sandboxes", fams, "pod_cpu_usage_seconds_total", "namespace=ns,pod=a", 2)
	check("two sandboxes", fams, "container_cpu_usage_seconds_total", "container=task,namespace=ns,pod=a", 2)
	check("two sandboxes", fams, "container_memory_working_set_bytes", "container=task,namespace=ns,pod=b", 4<<20)
	check("two sandboxes", fams, "scrape_error", "", 0)
	if m := find(fams, "container_start_time_seconds", "container=task,namespace=ns,pod=a"); m == nil || value(m) <= 0 {
		t.Fatalf("container_start_time_seconds: %v", m)
	}

	node.set("uid-b", 4, false)
	node.set("uid-a", 2, true)
	fams = metrics()
	check("a does not answer", fams, "node_cpu_usage_seconds_total", "", 6) // a's last reading is kept
	check("a does not answer", fams, "pod_cpu_usage_seconds_total", "namespace=ns,pod=a", none)
	check("a does not answer", fams, "scrape_error", "", 1)

	node.set("uid-a", 2.5, false)
	if err := h.p.DeletePod(t.Context(), b); err != nil {
		t.Fatal(err)
	}
	poll(t, "b to be gone", func() bool {
		_, err := h.p.GetPod(t.Context(), "ns", "b")
		return err != nil
	})
	fams = metrics()
	check("b ended", fams, "node_cpu_usage_seconds_total", "", 6.5) // 2.5 running + 4 retired
	check("b ended", fams, "pod_cpu_usage_seconds_total", "namespace=ns,pod=b", none)
	check("b ended", fams, "scrape_error", "", 0)

	sum, err := h.p.GetStatsSummary(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.Pods) != 1 || len(sum.Pods[0].Containers) != 1 || sum.Pods[0].Containers[0].Name != "task" ||
		*sum.Pods[0].Containers[0].CPU.UsageCoreNanoSeconds != 2_500_000_000 || *sum.Node.CPU.UsageCoreNanoSeconds != 6_500_000_000 {
		t.Fatalf("summary: %+v", sum)
	}
}

package vk

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/fake"
	vkapi "github.com/sandman-dev/sandman/vk/api"
)

// TestUsageRing: CPU use becomes a percentage of the sandbox's cores over
// each sample's span; a full ring halves its samples and keeps the CPU time
// of each pair, so the percentages over the longer spans stay true; the
// ring never holds more than usageRingSize samples.
func TestUsageRing(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	r := newUsageRing(base, 5*time.Second)
	// 2 cores; each 5 s the sandbox uses 2.5 s of CPU: 25 %.
	for i := 1; i <= 4; i++ {
		r.add(base.Add(time.Duration(i)*5*time.Second), runtime.Stats{
			CPUUsageNanos: uint64(i) * 2_500_000_000, MemoryBytes: uint64(i) << 20, MemoryLimitBytes: 1 << 30,
			DiskBytes: 3 << 20, DiskLimitBytes: 1 << 30,
		})
	}
	// Too soon after the last: not kept.
	r.add(base.Add(21*time.Second), runtime.Stats{CPUUsageNanos: 99e9})
	got := r.read(time.Time{}, time.Time{}, 2, 0)
	if len(got) != 4 {
		t.Fatalf("%d samples, want 4: %+v", len(got), got)
	}
	for i, s := range got {
		if s.CPUUsedPct != 25 || s.CPUCount != 2 || s.MemoryBytes != uint64(i+1)<<20 || s.MemoryLimitBytes != 1<<30 ||
			s.DiskBytes != 3<<20 || s.DiskLimitBytes != 1<<30 || !s.Time.Equal(base.Add(time.Duration(i+1)*5*time.Second)) {
			t.Fatalf("sample %d: %+v", i, s)
		}
	}
	// The range includes both ends.
	if got := r.read(base.Add(10*time.Second), base.Add(15*time.Second), 2, 0); len(got) != 2 || !got[0].Time.Equal(base.Add(10*time.Second)) {
		t.Fatalf("range: %+v", got)
	}

	// A long life: the ring stays bounded, covers it all, and a sandbox
	// that used a whole core throughout reads 50 % of 2 cores everywhere.
	r = newUsageRing(base, 5*time.Second)
	at := base
	for i := 1; i <= 2000; i++ {
		at = base.Add(time.Duration(i) * 5 * time.Second)
		r.add(at, runtime.Stats{CPUUsageNanos: uint64(at.Sub(base))})
		if len(r.samples) > usageRingSize {
			t.Fatalf("after %d readings: %d samples", i, len(r.samples))
		}
	}
	got = r.read(time.Time{}, time.Time{}, 2, 512<<20)
	if len(got) < usageRingSize/2 || got[len(got)-1].Time.Before(at.Add(-r.gap)) || got[0].Time.After(base.Add(r.gap)) {
		t.Fatalf("%d samples from %s to %s (gap %s), want the whole life to %s", len(got), got[0].Time, got[len(got)-1].Time, r.gap, at)
	}
	for i, s := range got {
		if s.CPUUsedPct != 50 || s.MemoryLimitBytes != 512<<20 {
			t.Fatalf("sample %d of %d: %+v", i, len(got), s)
		}
	}
	if r.gap <= 5*time.Second {
		t.Fatalf("gap %s: never thinned", r.gap)
	}
}

// usageResponse calls the usage route.
func usageCall(t *testing.T, p *Provider, q url.Values) (int, vkapi.UsageResponse) {
	t.Helper()
	mux := http.NewServeMux()
	p.AttachAPI(mux)
	rec := httptest.NewRecorder()
	mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, vkapi.APIPrefix+"usage?"+q.Encode(), nil))
	var out vkapi.UsageResponse
	if rec.Code == http.StatusOK {
		if err := json.Unmarshal(rec.Body.Bytes(), &out); err != nil {
			t.Fatalf("%s: %v", rec.Body, err)
		}
	}
	return rec.Code, out
}

// TestUsageRoute: the node agents' readings of a running sandbox are kept
// and served by pod, range and latest; pods the node does not hold are left
// out; a deleted pod's samples go with it; bad queries are refused.
func TestUsageRoute(t *testing.T) {
	node := &cpuNode{cpu: map[string]uint64{}, fail: map[string]bool{}}
	h := newHarnessWith(t, 4, func(f *fake.Runtime) runtime.Runtime {
		node.Runtime = f
		return node
	})
	pod := testPod("a", "img") // requests 250m: one core
	if err := h.p.CreatePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	h.wait(t, pod.UID, "a Ready", isReady)

	// A sampling round reads it from its node agent.
	node.set("uid-a", 1, false)
	h.p.sampleUsage(t.Context())
	code, res := usageCall(t, h.p, url.Values{"namespace": {"ns"}, "pod": {"a", "nosuchpod"}})
	if code != http.StatusOK || len(res.Pods) != 1 || res.Pods[0].Pod != "a" || len(res.Pods[0].Samples) != 1 {
		t.Fatalf("%d %+v", code, res)
	}
	if s := res.Pods[0].Samples[0]; s.MemoryBytes != 4<<20 || s.CPUCount != 1 || s.DiskBytes != 1<<20 {
		t.Fatalf("first sample %+v", s)
	}

	// Readings at known times: 0.5 s of CPU in each 1 s is 50 % of one core.
	h.p.mu.Lock()
	started := h.p.byUID["uid-a"].startedAt
	h.p.byUID["uid-a"].usage = nil
	h.p.mu.Unlock()
	for i := 1; i <= 3; i++ {
		h.p.recordUsage("uid-a", runtime.Stats{Time: started.Add(time.Duration(i) * 5 * time.Second), CPUUsageNanos: uint64(i) * 2_500_000_000, MemoryBytes: 8 << 20})
	}
	unix := func(d time.Duration) string { return strconv.FormatInt(started.Add(d).Unix(), 10) }
	_, res = usageCall(t, h.p, url.Values{"namespace": {"ns"}, "pod": {"a"}})
	if s := res.Pods[0].Samples; len(s) != 3 || s[0].CPUUsedPct != 50 || s[2].CPUUsedPct != 50 || s[1].MemoryBytes != 8<<20 {
		t.Fatalf("samples %+v", s)
	}
	_, res = usageCall(t, h.p, url.Values{"namespace": {"ns"}, "pod": {"a"}, "start": {unix(9 * time.Second)}, "end": {unix(14 * time.Second)}})
	if s := res.Pods[0].Samples; len(s) != 1 || s[0].Time.Sub(started) < 10*time.Second || s[0].Time.Sub(started) > 11*time.Second {
		t.Fatalf("samples from 9 s to 14 s: %+v", s)
	}
	_, res = usageCall(t, h.p, url.Values{"namespace": {"ns"}, "pod": {"a"}, "latest": {"true"}})
	if s := res.Pods[0].Samples; len(s) != 1 || s[0].Time.Sub(started) < 15*time.Second {
		t.Fatalf("latest: %+v", s)
	}

	for _, q := range []url.Values{
		{"pod": {"a"}},
		{"namespace": {"ns"}},
		{"namespace": {"ns"}, "pod": {"a"}, "start": {"yesterday"}},
		{"namespace": {"ns"}, "pod": {"a"}, "end": {"-1"}},
		{"namespace": {"ns"}, "pod": {"a"}, "latest": {"maybe"}},
	} {
		if code, _ := usageCall(t, h.p, q); code != http.StatusBadRequest {
			t.Fatalf("%v: %d, want 400", q, code)
		}
	}

	// Deleted: its samples go with it.
	if err := h.p.DeletePod(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	poll(t, "a forgotten", func() bool {
		_, res := usageCall(t, h.p, url.Values{"namespace": {"ns"}, "pod": {"a"}})
		return len(res.Pods) == 0
	})
}

// TestUsageRate: a round reads at most UsageRate sandboxes a second of
// UsageInterval, the most overdue first.
func TestUsageRate(t *testing.T) {
	node := &cpuNode{cpu: map[string]uint64{}, fail: map[string]bool{}}
	h := newHarnessWith(t, 4, func(f *fake.Runtime) runtime.Runtime {
		node.Runtime = f
		return node
	}, func(c *Config) { c.UsageInterval, c.UsageRate = time.Second, 2 })
	for _, name := range []string{"a", "b", "c"} {
		pod := testPod(name, "img")
		if err := h.p.CreatePod(t.Context(), pod); err != nil {
			t.Fatal(err)
		}
		h.wait(t, pod.UID, name+" Ready", isReady)
	}
	sampled := func() int {
		h.p.mu.Lock()
		defer h.p.mu.Unlock()
		n := 0
		for _, sb := range h.p.byUID {
			if sb.usage != nil {
				n++
			}
		}
		return n
	}
	h.p.sampleUsage(t.Context())
	if n := sampled(); n != 2 {
		t.Fatalf("after one round %d sandboxes sampled, want 2", n)
	}
	h.p.sampleUsage(t.Context())
	if n := sampled(); n != 3 {
		t.Fatalf("after two rounds %d sandboxes sampled, want 3", n)
	}
}

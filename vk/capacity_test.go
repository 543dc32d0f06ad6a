package vk

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/sandman-dev/sandman/runtime"
	vkapi "github.com/sandman-dev/sandman/vk/api"
)

// TestCapacityFollowsSandboxes: the capacity snapshot counts bound and warm
// slots, pods by phase and create→Ready samples as sandboxes come and go,
// and the page and its data are served.
func TestCapacityFollowsSandboxes(t *testing.T) {
	h := newHarness(t, 3)
	c := h.p.Capacity()
	if c.Pool != "t" || c.VirtualNode != "vn" || len(c.Nodes) != 1 || c.Totals.CapacitySlots != 3 ||
		c.Totals.Slots[runtime.StateWarm] != 3 || c.Totals.HealthyNodes != 1 {
		t.Fatalf("empty pool: %+v", c)
	}
	for _, name := range []string{"a", "b"} {
		if err := h.p.CreatePod(t.Context(), testPod(name, "img")); err != nil {
			t.Fatal(err)
		}
	}
	poll(t, "two sandboxes ready on the page", func() bool {
		c = h.p.Capacity()
		return c.Totals.Slots[runtime.StateBound] == 2 && c.Totals.Slots[runtime.StateWarm] == 1 &&
			c.Pods[string(corev1.PodRunning)] == 2 && c.CreateToReady.Count == 2
	})
	n := c.Nodes[0]
	if n.Name != "w1" || !n.Healthy || n.Slots[runtime.StateBound] != 2 || n.Binds != 2 || n.BindP99MS <= 0 {
		t.Fatalf("node row %+v", n)
	}
	sum := 0
	for _, b := range c.CreateToReady.Buckets {
		sum += b.Count
	}
	if sum != 2 || c.CreateToReady.P50MS <= 0 {
		t.Fatalf("histogram %+v", c.CreateToReady)
	}

	if err := h.p.DeletePod(t.Context(), testPod("a", "img")); err != nil {
		t.Fatal(err)
	}
	poll(t, "one sandbox released", func() bool {
		c = h.p.Capacity()
		return c.Totals.Slots[runtime.StateBound] == 1 && c.Totals.Slots[runtime.StateWarm] == 2
	})

	mux := http.NewServeMux()
	h.p.AttachAPI(mux)
	srv := httptest.NewServer(mux)
	defer srv.Close()
	for path, want := range map[string]string{"/capacity": "text/html", "/capacity.json": "application/json", vkapi.APIPrefix + "capacity": "application/json"} {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), want) {
			t.Fatalf("%s: %s %s", path, resp.Status, resp.Header.Get("Content-Type"))
		}
		if want == "application/json" {
			var got vkapi.Capacity
			if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || got.Totals.Slots[runtime.StateBound] != 1 {
				t.Fatalf("%s: %+v %v", path, got.Totals, err)
			}
		}
		resp.Body.Close()
	}
}

// TestCapacityImageRefsOnlyWhenAuthorized: the capacity page's data on an
// unauthenticated listener (AttachCapacity: the metrics port, which any
// pod may reach) counts each node's images but names none (their refs
// and digests are private registry paths, snapshots, templates); on the
// kubelet port's routes (AttachAPI, behind its authorization) it names
// them too.
func TestCapacityImageRefsOnlyWhenAuthorized(t *testing.T) {
	h := newHarness(t, 3)
	type node struct {
		Images     []string `json:"images"`
		ImageCount int      `json:"image_count"`
	}
	get := func(t *testing.T, mux *http.ServeMux, path string) (node, string) {
		t.Helper()
		srv := httptest.NewServer(mux)
		defer srv.Close()
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, err := io.ReadAll(resp.Body)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %s %v", path, resp.Status, err)
		}
		var c struct {
			Nodes []node `json:"nodes"`
		}
		if err := json.Unmarshal(raw, &c); err != nil || len(c.Nodes) != 1 {
			t.Fatalf("%s: %s: %v", path, raw, err)
		}
		return c.Nodes[0], string(raw)
	}
	public := http.NewServeMux()
	h.p.AttachCapacity(public)
	authorized := http.NewServeMux()
	h.p.AttachAPI(authorized)
	for _, tc := range []struct {
		name   string
		mux    *http.ServeMux
		path   string
		images bool
	}{
		{"metrics listener", public, "/capacity.json", false},
		{"kubelet port page", authorized, "/capacity.json", true},
		{"kubelet port API", authorized, vkapi.APIPrefix + "capacity", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, raw := get(t, tc.mux, tc.path)
			if n.ImageCount != 1 {
				t.Errorf("image_count %d, want 1", n.ImageCount)
			}
			switch {
			case tc.images && (len(n.Images) != 1 || !strings.Contains(n.Images[0], "img")):
				t.Errorf("images %q, want the node's one", n.Images)
			case !tc.images && (len(n.Images) != 0 || strings.Contains(raw, "img")):
				t.Errorf("an unauthenticated caller is told the node's images: %s", raw)
			}
		})
	}
}

// TestUnhealthyNodeLeavesTheTotals: a node agent that goes away shows as
// unhealthy, and its capacity leaves the totals.
func TestUnhealthyNodeLeavesTheTotals(t *testing.T) {
	h := newHarness(t, 3)
	h.node.Close()
	poll(t, "the node unhealthy", func() bool {
		c := h.p.Capacity()
		return len(c.Nodes) == 1 && !c.Nodes[0].Healthy && c.Nodes[0].Error != "" &&
			c.Totals.CapacitySlots == 0 && c.Totals.CPU.Capacity == 0 && c.Totals.HealthyNodes == 0
	})
}

func TestReadyHistogramWindow(t *testing.T) {
	var r readyRing
	now := time.Now()
	r.add(now.Add(-10*time.Minute), time.Second) // outside the window
	r.add(now, 30*time.Millisecond)
	r.add(now, 100*time.Millisecond) // on a bucket's bound: that bucket
	r.add(now, time.Minute)          // past the last bound
	h := r.histogram(now)
	if h.Count != 3 {
		t.Fatalf("count %d, want 3 (one sample is too old)", h.Count)
	}
	got := map[float64]int{}
	for _, b := range h.Buckets {
		got[b.LeMS] = b.Count
	}
	if got[50] != 1 || got[100] != 1 || got[0] != 1 {
		t.Fatalf("buckets %+v", h.Buckets)
	}
	if h.P50MS != 100 || h.P99MS != 100 {
		t.Fatalf("p50 %v p99 %v", h.P50MS, h.P99MS)
	}
}

func TestResourceOf(t *testing.T) {
	for path, want := range map[string]string{
		"/api/v1/namespaces/ns/pods/p/status":                               "pods/status",
		"/api/v1/namespaces/ns/pods":                                        "pods",
		"/api/v1/nodes/vn":                                                  "nodes",
		"/api/v1/namespaces/ns/events":                                      "events",
		"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/vn": "leases",
		"/api/v1/namespaces/ns":                                             "namespaces",
		"/healthz":                                                          "other",
	} {
		if got := resourceOf(path); got != want {
			t.Errorf("resourceOf(%s) = %s, want %s", path, got, want)
		}
	}
}

func TestPrePullDone(t *testing.T) {
	names := map[string]bool{"img": true}
	ni := func(node string, st runtime.ImageState) vkapi.NodeImage {
		return vkapi.NodeImage{Node: node, ImageStatus: runtime.ImageStatus{Image: "img", State: st}}
	}
	for _, tc := range []struct {
		nodes       []vkapi.NodeImage
		done, ready bool
	}{
		{[]vkapi.NodeImage{ni("a", runtime.ImageReady), ni("b", runtime.ImagePulling)}, false, false},
		{[]vkapi.NodeImage{ni("a", runtime.ImageReady), ni("b", runtime.ImageReady)}, true, true},
		{[]vkapi.NodeImage{ni("a", runtime.ImageReady), ni("b", runtime.ImageFailed)}, true, false},
		{[]vkapi.NodeImage{ni("a", runtime.ImageReady), {Node: "b", NodeError: "down"}}, true, false},
	} {
		done, ready := prePullDone(tc.nodes, names)
		if done != tc.done || ready != tc.ready {
			t.Errorf("%+v: done %v ready %v, want %v %v", tc.nodes, done, ready, tc.done, tc.ready)
		}
	}
}

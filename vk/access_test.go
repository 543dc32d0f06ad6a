package vk

import (
	"errors"
	"strings"
	"testing"

	vkerrdefs "github.com/virtual-kubelet/virtual-kubelet/errdefs"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	corev1listers "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/sandman-dev/sandman/podcontract"
)

// TestPoolAccess: a pod of a namespace the pool's access rule leaves out
// fails with NamespaceNotAllowed and a Warning event naming the namespace,
// the pool and how an operator allows it, and takes no slot; pods of
// namespaces the rule names or selects run. The rule holds for a pod that
// set spec.nodeName itself (no selector, no toleration), and for a
// namespace created too recently for the informer (read from the API).
func TestPoolAccess(t *testing.T) {
	sel, err := labels.Parse("team=ml")
	if err != nil {
		t.Fatal(err)
	}
	nsObj := func(name string, l map[string]string) *corev1.Namespace {
		return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l}}
	}
	cached := []*corev1.Namespace{nsObj("ml", map[string]string{"team": "ml"}), nsObj("named", nil), nsObj("evil", map[string]string{"team": "web"})}
	for _, tc := range []struct {
		name     string
		names    []string
		selector labels.Selector
		ns       string
		allowed  bool
		want     []string // in the refusal message
	}{
		{"open pool", nil, nil, "evil", true, nil},
		{"named", []string{"named"}, nil, "named", true, nil},
		{"not named", []string{"named"}, nil, "evil", false, []string{"namespace evil", "pool t", "virtual node vn", "--allowed-namespaces"}},
		{"selected", nil, sel, "ml", true, nil},
		{"not selected", nil, sel, "evil", false, []string{"namespace evil", "pool t", "team=ml", "kubectl label namespace evil", "--allowed-namespaces"}},
		{"named beside a selector", []string{"named"}, sel, "named", true, nil},
		{"new namespace, selected", nil, sel, "fresh", true, nil},
		{"no such namespace", nil, sel, "gone", false, []string{"namespace gone"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
			for _, n := range cached {
				if err := idx.Add(n); err != nil {
					t.Fatal(err)
				}
			}
			rec := record.NewFakeRecorder(10)
			h := newHarness(t, 1, func(c *Config) {
				c.AllowedNamespaces, c.AllowedNamespaceSelector = tc.names, tc.selector
				c.Namespaces = corev1listers.NewNamespaceLister(idx)
				c.Recorder = rec
			})
			// Only the apiserver has it yet.
			if _, err := h.client.CoreV1().Namespaces().Create(t.Context(), nsObj("fresh", map[string]string{"team": "ml"}), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			pod := testPod("p", "img")
			pod.Namespace = tc.ns
			pod.UID = types.UID("uid-" + tc.ns)
			// Straight to the node: no selector, no toleration.
			pod.Spec.NodeName = "vn"
			if err := h.p.CreatePod(t.Context(), pod); err != nil {
				t.Fatal(err)
			}
			if tc.allowed {
				h.wait(t, pod.UID, "Ready", isReady)
				return
			}
			got := h.wait(t, pod.UID, "Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
			if got.Status.Reason != podcontract.ReasonNamespaceNotAllowed {
				t.Fatalf("reason %q, want %s", got.Status.Reason, podcontract.ReasonNamespaceNotAllowed)
			}
			for _, w := range tc.want {
				if !strings.Contains(got.Status.Message, w) {
					t.Errorf("message %q does not say %q", got.Status.Message, w)
				}
			}
			select {
			case ev := <-rec.Events:
				if !strings.HasPrefix(ev, "Warning "+podcontract.ReasonNamespaceNotAllowed+" ") || !strings.Contains(ev, "namespace "+tc.ns) {
					t.Errorf("event %q", ev)
				}
			default:
				t.Error("no event")
			}
			if n := h.warmSlots(t); n != 1 {
				t.Errorf("%d warm slots after the refusal, want the 1 untouched", n)
			}
		})
	}
}

// TestPoolAccessNeedsNamespaces: a selector without a namespace lister is
// a configuration error, not a pool that refuses everyone.
func TestPoolAccessNeedsNamespaces(t *testing.T) {
	h := newHarness(t, 1)
	_, err := New(Config{NodeName: "vn", Pool: h.pool, Client: h.client, AllowedNamespaceSelector: labels.Everything()})
	if err == nil || !strings.Contains(err.Error(), "Namespaces") {
		t.Fatalf("New = %v, want an error naming Namespaces", err)
	}
}

// TestPoolAccessReadError: when a namespace's labels cannot be read (the
// apiserver away), CreatePod returns the error, so virtual-kubelet retries
// the pod, rather than failing it for good or letting it in.
func TestPoolAccessReadError(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	h := newHarness(t, 1, func(c *Config) {
		c.AllowedNamespaceSelector = labels.SelectorFromSet(labels.Set{"team": "ml"})
		c.Namespaces = corev1listers.NewNamespaceLister(idx)
	})
	h.client.PrependReactor("get", "namespaces", func(k8stesting.Action) (bool, kruntime.Object, error) {
		return true, nil, errors.New("apiserver unreachable")
	})
	pod := testPod("p", "img")
	if err := h.p.CreatePod(t.Context(), pod); err == nil || !strings.Contains(err.Error(), "apiserver unreachable") {
		t.Fatalf("CreatePod = %v, want the read error", err)
	}
	if _, err := h.p.GetPod(t.Context(), pod.Namespace, pod.Name); !vkerrdefs.IsNotFound(err) {
		t.Fatalf("GetPod after a failed create = %v, want not found (nothing recorded, so the retry starts afresh)", err)
	}
}

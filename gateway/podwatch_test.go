package gateway

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// The gateway lists and watches pods only in the namespaces its keys
// name, following the keys Secret, and never across the cluster.
func TestWatchesKeysNamespaces(t *testing.T) {
	e := newEnv(t)
	if got := e.gw.pods.namespaces(); !slices.Equal(got, []string{nsA, nsB}) {
		t.Fatalf("watched %v, want the keys' namespaces", got)
	}
	const nsC, rawKeyC = "team-c", "e2b_cccccccccccccccccccccccccccccccccccccccc"
	secrets := e.client.CoreV1().Secrets(systemNS)
	s, err := secrets.Get(context.Background(), keysName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Data["carol"] = keyEntryJSON(rawKeyC, nsC, "pool-c")
	if _, err := secrets.Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, "team-c watched", func() bool { return e.gw.pods.synced(nsC) })
	// The new key's sandboxes are made and routed like any other's.
	if sb, _ := e.createReady(rawKeyC, nsC, map[string]any{"templateID": "base"}); sb.SandboxID == "" {
		t.Fatal("no sandbox")
	}
	delete(s.Data, "bob")
	if _, err := secrets.Update(context.Background(), s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	poll(t, "team-b forgotten", func() bool { return !e.gw.pods.watches(nsB) })
	for _, a := range e.client.Actions() {
		if a.GetResource().Resource != "pods" || (a.GetVerb() != "list" && a.GetVerb() != "watch") {
			continue
		}
		if ns := a.GetNamespace(); ns != nsA && ns != nsB && ns != nsC {
			t.Errorf("%s pods in namespace %q: only the keys' namespaces may be read", a.GetVerb(), ns)
		}
	}
}

// With --namespaces, a key naming another namespace cannot create there.
func TestFixedNamespaces(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.Namespaces = []string{nsA} })
	r := e.call(http.MethodPost, "/v2/sandboxes", rawKeyB, map[string]any{"templateID": "base"})
	if r.status != http.StatusInternalServerError || !strings.Contains(r.apiError(t).Message, "not one the gateway watches") {
		t.Fatalf("create in an unwatched namespace: %d %s", r.status, r.body)
	}
	l, err := e.client.CoreV1().Pods(nsB).List(context.Background(), metav1.ListOptions{})
	if err != nil || len(l.Items) != 0 {
		t.Fatalf("pods in %s: %v %v", nsB, l, err)
	}
	if _, pod := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base"}); pod.Namespace != nsA {
		t.Fatalf("pod in %s", pod.Namespace)
	}
}

// A namespace the gateway may not list pods in (its RoleBinding missing)
// does not keep the others from being served: the gateway becomes ready,
// the other keys create, and that namespace's creates answer 503 saying
// why.
func TestNamespaceWithoutRole(t *testing.T) {
	defer func(d time.Duration) { podSyncWait = d }(podSyncWait)
	podSyncWait = 200 * time.Millisecond
	e := newEnv(t, func(c *Config) {
		c.Client.(*fake.Clientset).PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
			if a.GetNamespace() == nsB {
				return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "", errors.New("no RoleBinding"))
			}
			return false, nil, nil
		})
	})
	if _, pod := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base"}); pod.Namespace != nsA {
		t.Fatalf("pod in %s", pod.Namespace)
	}
	r := e.call(http.MethodPost, "/v2/sandboxes", rawKeyB, map[string]any{"templateID": "base"})
	if r.status != http.StatusServiceUnavailable || !strings.Contains(r.apiError(t).Message, "cannot list sandbox pods in namespace "+nsB) {
		t.Fatalf("create without the role: %d %s", r.status, r.body)
	}
}

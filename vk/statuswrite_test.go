package vk

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	corev1listers "k8s.io/client-go/listers/core/v1"
	ktesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"

	"github.com/sandman-dev/sandman/podcontract"
)

// TestStatusOnlyPods: the status virtual-kubelet writes with the provider's
// stale copy of a pod changes the pod's status and nothing else, and a
// write for a version the informer has moved past is refused as a
// conflict without reaching the API.
func TestStatusOnlyPods(t *testing.T) {
	ctx := t.Context()
	stored := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Namespace: "ns", Name: "p", UID: "u1", ResourceVersion: "6",
		Labels:      map[string]string{"team": "rl"},
		Annotations: map[string]string{podcontract.AnnotationExpiresAt: "2026-12-01T10:00:03Z"},
		Finalizers:  []string{"example.com/keep"},
	}}
	client := fake.NewClientset(stored.DeepCopy())
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	if err := idx.Add(stored.DeepCopy()); err != nil {
		t.Fatal(err)
	}
	pods := statusWritesOnly(client.CoreV1(), corev1listers.NewPodLister(idx))

	// The provider's copy: from before the annotation moved and the label
	// and finalizer were added; virtual-kubelet gives it the informer's
	// resourceVersion.
	stale := stored.DeepCopy()
	stale.Labels = nil
	stale.Annotations = map[string]string{podcontract.AnnotationExpiresAt: "2026-12-01T10:05:00Z"}
	stale.Finalizers = nil
	stale.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7"}
	if _, err := pods.Pods("ns").UpdateStatus(ctx, stale, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := client.CoreV1().Pods("ns").Get(ctx, "p", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != corev1.PodRunning || got.Status.PodIP != "10.0.0.7" {
		t.Errorf("status not written: %+v", got.Status)
	}
	if got.Annotations[podcontract.AnnotationExpiresAt] != "2026-12-01T10:00:03Z" || got.Labels["team"] != "rl" || len(got.Finalizers) != 1 {
		t.Errorf("the status write changed the pod's metadata: annotations %v labels %v finalizers %v", got.Annotations, got.Labels, got.Finalizers)
	}

	// The informer is at version 7: a write made for 6 is a conflict, and
	// nothing is sent.
	moved := stored.DeepCopy()
	moved.ResourceVersion = "7"
	if err := idx.Update(moved); err != nil {
		t.Fatal(err)
	}
	stale.Status.PodIP = "10.0.0.8"
	if _, err := pods.Pods("ns").UpdateStatus(ctx, stale, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Errorf("write for an old version: got %v, want a conflict", err)
	}
	if got, _ := client.CoreV1().Pods("ns").Get(ctx, "p", metav1.GetOptions{}); got.Status.PodIP != "10.0.0.7" {
		t.Errorf("a refused write reached the API: pod IP %s", got.Status.PodIP)
	}

	// Another pod of the same name: not found, as for a deleted one.
	other := stale.DeepCopy()
	other.UID, other.ResourceVersion = "u2", "7"
	if _, err := pods.Pods("ns").UpdateStatus(ctx, other, metav1.UpdateOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("write for another pod of the name: got %v, want not found", err)
	}
}

// A pod the informer holds deleted with grace 0 is not deleted again;
// any other is.
func TestStatusOnlyPodsSkipsDeletingWhatIsGone(t *testing.T) {
	marked := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "gone", UID: "u1",
		DeletionTimestamp: &metav1.Time{Time: time.Now()}, DeletionGracePeriodSeconds: ptr.To(int64(0))}}
	graceful := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "graceful", UID: "u2",
		DeletionTimestamp: &metav1.Time{Time: time.Now()}, DeletionGracePeriodSeconds: ptr.To(int64(30))}}
	client := fake.NewClientset(graceful.DeepCopy())
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, pod := range []*corev1.Pod{marked, graceful} {
		if err := idx.Add(pod); err != nil {
			t.Fatal(err)
		}
	}
	pods := statusWritesOnly(client.CoreV1(), corev1listers.NewPodLister(idx)).Pods("ns")
	uid := types.UID("u1")
	if err := pods.Delete(t.Context(), "gone", metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}}); err != nil {
		t.Fatalf("deleting a pod removed at once: %v", err)
	}
	if err := pods.Delete(t.Context(), "graceful", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	var deleted []string
	for _, a := range client.Actions() {
		if d, ok := a.(ktesting.DeleteAction); ok {
			deleted = append(deleted, d.GetName())
		}
	}
	if !slices.Equal(deleted, []string{"graceful"}) {
		t.Fatalf("DELETE requests for %v, want only graceful", deleted)
	}
}

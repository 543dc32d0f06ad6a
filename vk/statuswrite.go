package vk

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
)

// A pods/status update writes more than the status: the apiserver resets
// only spec, deletionTimestamp and ownerReferences from the stored pod, so
// the labels, annotations and finalizers sent with it replace the stored
// ones. virtual-kubelet's pod controller sends the provider's copy of the
// pod with the new status and the resourceVersion of its informer's copy;
// the provider's copy lags any change made to the pod since the provider
// last saw it, and the write put that change back (an E2B setTimeout's
// sandman.io/expires-at went back to the old time, so the sandbox was not
// reclaimed). A kubelet writes only the status.

// statusWritesOnly wraps the pod client virtual-kubelet writes statuses
// with: UpdateStatus sends the pod as pods (the informer virtual-kubelet
// reads) has it at the resourceVersion virtual-kubelet chose, with the
// provider's status, so only the status changes. When the informer has
// moved past that version the write would conflict anyway: it is refused
// as a conflict without a request, and virtual-kubelet retries with the
// pod as it now is.
func statusWritesOnly(pods corev1client.PodsGetter, lister corev1listers.PodLister) corev1client.PodsGetter {
	return statusOnlyPods{PodsGetter: pods, lister: lister}
}

type statusOnlyPods struct {
	corev1client.PodsGetter
	lister corev1listers.PodLister
}

func (s statusOnlyPods) Pods(namespace string) corev1client.PodInterface {
	return statusOnlyPodInterface{PodInterface: s.PodsGetter.Pods(namespace), lister: s.lister.Pods(namespace)}
}

type statusOnlyPodInterface struct {
	corev1client.PodInterface
	lister corev1listers.PodNamespaceLister
}

func (c statusOnlyPodInterface) UpdateStatus(ctx context.Context, pod *corev1.Pod, opts metav1.UpdateOptions) (*corev1.Pod, error) {
	cur, err := c.lister.Get(pod.Name)
	if err != nil {
		return nil, err
	}
	if cur.UID != pod.UID {
		return nil, apierrors.NewNotFound(corev1.Resource("pods"), pod.Name)
	}
	if pod.ResourceVersion != "" && cur.ResourceVersion != pod.ResourceVersion {
		return nil, apierrors.NewConflict(corev1.Resource("pods"), pod.Name,
			fmt.Errorf("the pod changed since version %s (now %s): write its status again", pod.ResourceVersion, cur.ResourceVersion))
	}
	return c.PodInterface.UpdateStatus(ctx, withStatus(cur, pod), opts)
}

// Delete skips the request for a pod the informer holds marked for
// deletion with grace 0: the apiserver removed it in the request that
// marked it (the informer sees the mark first, then the removal), so
// asking again only costs a read of etcd for a 404. virtual-kubelet's pod
// controller deletes every such pod again once its provider let it go.
func (c statusOnlyPodInterface) Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error {
	if cur, err := c.lister.Get(name); err == nil && removedAtOnce(cur) &&
		(opts.Preconditions == nil || opts.Preconditions.UID == nil || *opts.Preconditions.UID == cur.UID) {
		return nil
	}
	return c.PodInterface.Delete(ctx, name, opts)
}

// removedAtOnce: pod was deleted with grace 0, so the apiserver removed
// it (or holds it only for its finalizers) in the same request.
func removedAtOnce(pod *corev1.Pod) bool {
	g := pod.DeletionGracePeriodSeconds
	return pod.DeletionTimestamp != nil && g != nil && *g == 0
}

// withStatus is cur, as the API has it, with the status of pod.
func withStatus(cur, pod *corev1.Pod) *corev1.Pod {
	out := cur.DeepCopy()
	out.Status = *pod.Status.DeepCopy()
	return out
}

//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/sandman-dev/sandman/e2e/framework"
)

// TestSmokeControlPlane checks the real control plane end to end: a labelled,
// tainted Node marked Ready loses its not-ready taint through
// kube-controller-manager, and kube-scheduler binds a pod with the matching
// node selector and toleration to it.
func TestSmokeControlPlane(t *testing.T) {
	s := framework.Get(t)
	ctx := t.Context()
	kube := s.Kube
	suffix := rand.String(6)
	nodeName := "smoke-" + suffix
	taint := corev1.Taint{Key: "sandman.io/virtual-node", Value: "smoke", Effect: corev1.TaintEffectNoSchedule}

	ns, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{
		ObjectMeta: metav1.ObjectMeta{Name: "smoke-" + suffix},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	s.NamespaceReady(t, ns.Name)
	t.Cleanup(func() {
		cleanup(t, "namespace", kube.CoreV1().Namespaces().Delete(context.WithoutCancel(ctx), ns.Name, metav1.DeleteOptions{}))
	})

	node, err := kube.CoreV1().Nodes().Create(ctx, &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:   nodeName,
			Labels: map[string]string{"sandman.io/pool": "smoke", "type": "virtual-kubelet", "kubernetes.io/os": "linux"},
		},
		Spec: corev1.NodeSpec{Taints: []corev1.Taint{taint}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create node: %v", err)
	}
	t.Cleanup(func() {
		cleanup(t, "node", kube.CoreV1().Nodes().Delete(context.WithoutCancel(ctx), nodeName, metav1.DeleteOptions{}))
	})
	if !hasTaint(node, corev1.TaintNodeNotReady) {
		t.Fatalf("new node has taints %v; want the apiserver's %s taint until it is Ready", node.Spec.Taints, corev1.TaintNodeNotReady)
	}

	// Mark it Ready with capacity, and keep its lease fresh like a kubelet.
	// kube-controller-manager writes to new nodes too: retry on conflict.
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		n, err := kube.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		now := metav1.Now()
		n.Status.Capacity = corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("4"),
			corev1.ResourceMemory: resource.MustParse("8Gi"),
			corev1.ResourcePods:   resource.MustParse("110"),
		}
		n.Status.Allocatable = n.Status.Capacity
		n.Status.Conditions = []corev1.NodeCondition{{
			Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "SmokeTest",
			LastHeartbeatTime: now, LastTransitionTime: now,
		}}
		_, err = kube.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	})
	if err != nil {
		t.Fatalf("mark node Ready: %v", err)
	}
	if _, err := kube.CoordinationV1().Leases(corev1.NamespaceNodeLease).Create(ctx, &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: nodeName},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity: ptr.To(nodeName), LeaseDurationSeconds: ptr.To[int32](40),
			RenewTime: &metav1.MicroTime{Time: time.Now()},
		},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create node lease: %v", err)
	}
	t.Cleanup(func() {
		cleanup(t, "lease", kube.CoordinationV1().Leases(corev1.NamespaceNodeLease).Delete(context.WithoutCancel(ctx), nodeName, metav1.DeleteOptions{}))
	})

	framework.Eventually(t, 60*time.Second, "kube-controller-manager to remove the not-ready taint", func(ctx context.Context) (bool, error) {
		n, err := kube.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		return !hasTaint(n, corev1.TaintNodeNotReady), nil
	})
	// The taint we set ourselves must stay.
	n, err := kube.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !hasTaint(n, taint.Key) {
		t.Fatalf("node lost its own taint %s: %v", taint.Key, n.Spec.Taints)
	}

	framework.Eventually(t, 30*time.Second, "the namespace's default service account", func(ctx context.Context) (bool, error) {
		_, err := kube.CoreV1().ServiceAccounts(ns.Name).Get(ctx, "default", metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return false, nil
		}
		return err == nil, err
	})

	pod, err := kube.CoreV1().Pods(ns.Name).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "sandbox"},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"sandman.io/pool": "smoke"},
			Tolerations: []corev1.Toleration{{
				Key: taint.Key, Operator: corev1.TolerationOpEqual, Value: taint.Value, Effect: taint.Effect,
			}},
			Containers: []corev1.Container{{
				Name: "task", Image: s.BusyboxImage,
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
					corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi"),
				}},
			}},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("create pod: %v", err)
	}
	t.Cleanup(func() {
		cctx := context.WithoutCancel(ctx)
		cleanup(t, "pod", kube.CoreV1().Pods(ns.Name).Delete(cctx, pod.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}))
		// With no kubelet, a zero grace period removes the pod at once.
		framework.Eventually(t, 30*time.Second, "the pod to be gone", func(ctx context.Context) (bool, error) {
			_, err := kube.CoreV1().Pods(ns.Name).Get(cctx, pod.Name, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
	})
	framework.Eventually(t, 30*time.Second, "kube-scheduler to bind the pod", func(ctx context.Context) (bool, error) {
		p, err := kube.CoreV1().Pods(ns.Name).Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if p.Spec.NodeName != "" && p.Spec.NodeName != nodeName {
			return false, fmt.Errorf("pod bound to %q, want %q", p.Spec.NodeName, nodeName)
		}
		return p.Spec.NodeName == nodeName, nil
	})
}

func hasTaint(n *corev1.Node, key string) bool {
	for _, t := range n.Spec.Taints {
		if t.Key == key {
			return true
		}
	}
	return false
}

// cleanup reports a failed deletion; one that finds nothing is fine.
func cleanup(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil && !apierrors.IsNotFound(err) {
		t.Errorf("clean up %s: %v", what, err)
	}
}

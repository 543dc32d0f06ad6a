package main

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandman-dev/sandman/podcontract"
)

// TestForkPod: a fork's pod has its source's spec and node, its job and
// lease, the fork's annotations and run label, and none of the source's
// token, pause or status.
func TestForkPod(t *testing.T) {
	rc := "gvisor"
	src := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "src", Namespace: "team", UID: "u1",
			Labels: map[string]string{podcontract.LabelJob: "j", podcontract.LabelRun: "old"},
			Annotations: map[string]string{
				podcontract.AnnotationTokenSHA256: "ab", podcontract.AnnotationPause: "true",
				podcontract.AnnotationIdleTimeout: "5m",
			}},
		Spec: corev1.PodSpec{NodeName: "vnode-1", RuntimeClassName: &rc, Hostname: "h",
			Containers: []corev1.Container{{Name: "task", Image: "img", Command: []string{"sleep", "1"}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1"},
	}
	pod := forkPod(src, "r1", "")
	switch {
	case pod.GenerateName != "src-fork-" || pod.Namespace != "team":
		t.Errorf("name %q in %q", pod.GenerateName, pod.Namespace)
	case pod.Spec.NodeName != "vnode-1" || pod.Spec.RuntimeClassName == nil || *pod.Spec.RuntimeClassName != "gvisor":
		t.Errorf("spec: node %q, runtime class %v", pod.Spec.NodeName, pod.Spec.RuntimeClassName)
	case pod.Spec.Containers[0].Image != "img" || pod.Spec.Hostname != "":
		t.Errorf("containers %+v, hostname %q", pod.Spec.Containers, pod.Spec.Hostname)
	case pod.Annotations[podcontract.AnnotationForkOf] != "src" || pod.Annotations[podcontract.AnnotationForkID] != "r1":
		t.Errorf("fork annotations %v", pod.Annotations)
	case pod.Annotations[podcontract.AnnotationTokenSHA256] != "" || pod.Annotations[podcontract.AnnotationPause] != "":
		t.Errorf("the source's token or pause carried over: %v", pod.Annotations)
	case pod.Annotations[podcontract.AnnotationIdleTimeout] != "5m":
		t.Errorf("the idle lease did not carry over: %v", pod.Annotations)
	case pod.Labels[podcontract.LabelJob] != "j" || pod.Labels[podcontract.LabelRun] != "r1":
		t.Errorf("labels %v", pod.Labels)
	case pod.Status.Phase != "" || pod.UID != "":
		t.Errorf("status or UID carried over")
	}
	src.Spec.Containers[0].Image = "changed"
	if pod.Spec.Containers[0].Image != "img" {
		t.Errorf("the fork's spec shares its source's")
	}
}

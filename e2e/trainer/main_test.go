package main

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sandman-dev/sandman/podcontract"
)

func TestSandboxPod(t *testing.T) {
	o := options{image: "img", pool: "p1", podName: "trainer-x", podUID: "uid-1"}
	p := sandboxPod(o, "abc")
	if p.GenerateName != "trainer-x-sb-" || p.Labels[podcontract.LabelJob] != "trainer-x" || p.Annotations[podcontract.AnnotationTokenSHA256] != "abc" {
		t.Errorf("metadata: %+v", p.ObjectMeta)
	}
	if or := p.OwnerReferences; len(or) != 1 || or[0].Kind != "Pod" || or[0].UID != "uid-1" || *or[0].BlockOwnerDeletion {
		t.Errorf("owner references: %+v", or)
	}
	if p.Spec.NodeSelector[podcontract.LabelPool] != "p1" || len(p.Spec.Tolerations) != 1 || p.Spec.Containers[0].Image != "img" || p.Spec.Containers[0].Command != nil {
		t.Errorf("spec: %+v", p.Spec)
	}
}

// TestWaitReady: pods that become Ready (with an IP) through updates after
// the list are seen; a Failed one is reported; the wait ends without the
// timeout.
func TestWaitReady(t *testing.T) {
	kube := fake.NewClientset()
	pods := kube.CoreV1().Pods("ns")
	var sbs []*sandbox
	for _, n := range []string{"a", "b", "c"} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: n, Namespace: "ns", Labels: map[string]string{podcontract.LabelJob: "t"}}}
		if _, err := pods.Create(t.Context(), p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		sbs = append(sbs, &sandbox{name: n, created: time.Now()})
	}
	// Change the pods once the watch is open (the fake does not replay
	// from a resource version as the apiserver does).
	watching := make(chan struct{})
	var once sync.Once
	kube.PrependWatchReactor("pods", func(a k8stesting.Action) (bool, watch.Interface, error) {
		w, err := kube.Tracker().Watch(corev1.SchemeGroupVersion.WithResource("pods"), a.GetNamespace())
		once.Do(func() { close(watching) })
		return true, w, err
	})
	go func() {
		<-watching
		for _, n := range []string{"a", "b", "c"} {
			p, _ := pods.Get(context.Background(), n, metav1.GetOptions{})
			if n == "c" {
				p.Status = corev1.PodStatus{Phase: corev1.PodFailed, Reason: "InvalidSpec", Message: "no token"}
			} else {
				p.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.1",
					Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
			}
			_, _ = pods.UpdateStatus(context.Background(), p, metav1.UpdateOptions{})
		}
	}()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := waitReady(ctx, pods, podcontract.LabelJob+"=t", sbs); err != nil {
		t.Fatal(err)
	}
	if sbs[0].ready.IsZero() || sbs[1].ip != "10.0.0.1" || sbs[2].err == nil || !strings.Contains(sbs[2].err.Error(), "InvalidSpec") {
		t.Errorf("a %+v, b %+v, c %+v", sbs[0], sbs[1], sbs[2])
	}
	s := summarize(sbs)
	if s.Sandboxes != 3 || s.OK != 2 || len(s.Failed) != 1 || !strings.HasPrefix(s.Failed[0], "c: ") {
		t.Errorf("summary %+v", s)
	}
}

func TestPercentile(t *testing.T) {
	ms := []int64{50, 10, 40, 20, 30, 100, 90, 80, 70, 60}
	slices.Sort(ms)
	if p50, p99 := percentile(ms, 50), percentile(ms, 99); p50 != 50 || p99 != 100 {
		t.Errorf("p50 %d p99 %d, want 50 100", p50, p99)
	}
	if percentile(nil, 50) != 0 {
		t.Error("percentile of nothing is not 0")
	}
}

package vk

import (
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	kfake "k8s.io/client-go/kubernetes/fake"
	ktesting "k8s.io/client-go/testing"
)

func podOn(name, node string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns"}, Spec: corev1.PodSpec{NodeName: node}}
}

// The node's pod informer asks for spec.nodeName=<node>; the apiserver is
// asked for all assigned pods and only the node's come back.
func TestWidePodWatchAsksForAssignedPodsAndKeepsTheNodes(t *testing.T) {
	kube := kfake.NewClientset(podOn("mine", "vn"), podOn("theirs", "w1"))
	var selectors []string
	kube.PrependReactor("list", "pods", func(a ktesting.Action) (bool, runtime.Object, error) {
		selectors = append(selectors, a.(ktesting.ListAction).GetListRestrictions().Fields.String())
		return false, nil, nil // the tracker answers (it ignores field selectors)
	})
	fw := watch.NewFake()
	kube.PrependWatchReactor("pods", func(a ktesting.Action) (bool, watch.Interface, error) {
		selectors = append(selectors, a.(ktesting.WatchAction).GetWatchRestrictions().Fields.String())
		return true, fw, nil
	})
	pods := widePodWatch(kube, "vn").CoreV1().Pods("")

	list, err := pods.List(t.Context(), metav1.ListOptions{FieldSelector: "spec.nodeName=vn"})
	if err != nil {
		t.Fatal(err)
	}
	if len(list.Items) != 1 || list.Items[0].Name != "mine" {
		t.Fatalf("listed %d pods (%v), want only the node's", len(list.Items), list.Items)
	}
	w, err := pods.Watch(t.Context(), metav1.ListOptions{FieldSelector: "spec.nodeName=vn"})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	go func() {
		fw.Add(podOn("theirs-2", "w1"))
		fw.Add(podOn("mine-2", "vn"))
		fw.Action(watch.Bookmark, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "42"}})
		fw.Delete(podOn("theirs", "w1"))
		fw.Delete(podOn("mine", "vn"))
	}()
	var got []string
	for len(got) < 3 {
		select {
		case e := <-w.ResultChan():
			got = append(got, string(e.Type)+" "+e.Object.(*corev1.Pod).Name+e.Object.(*corev1.Pod).ResourceVersion)
		case <-time.After(10 * time.Second):
			t.Fatalf("events so far: %v", got)
		}
	}
	if want := []string{"ADDED mine-2", "BOOKMARK 42", "DELETED mine"}; !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if want := []string{"spec.nodeName!=", "spec.nodeName!="}; !slices.Equal(selectors, want) {
		t.Fatalf("asked the apiserver with %q, want %q", selectors, want)
	}

	// Any other selector is asked as given.
	selectors = nil
	if _, err := pods.List(t.Context(), metav1.ListOptions{FieldSelector: "spec.nodeName=w1"}); err != nil {
		t.Fatal(err)
	}
	if len(selectors) != 1 || selectors[0] != "spec.nodeName=w1" {
		t.Fatalf("another node's selector became %q", selectors)
	}
}

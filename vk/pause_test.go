package vk

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	nodev1listers "k8s.io/client-go/listers/node/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
)

func pausedCondition(pod *corev1.Pod) (corev1.PodCondition, bool) {
	for _, c := range pod.Status.Conditions {
		if c.Type == podcontract.ConditionPaused {
			return c, true
		}
	}
	return corev1.PodCondition{}, false
}

// TestPauseAnnotation: a gVisor pod annotated sandman.io/pause=true is
// paused — its status says Paused, it is not Ready, its slot is paused on
// the node — and resumed when the annotation goes, Ready again. A runc
// pod's pause fails with a warning naming CRIU and the pod stays Ready.
func TestPauseAnnotation(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	if err := idx.Add(&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "runsc"}); err != nil {
		t.Fatal(err)
	}
	rec := record.NewFakeRecorder(100)
	h := newHarness(t, 2, func(c *Config) {
		c.RuntimeClasses, c.Recorder = nodev1listers.NewRuntimeClassLister(idx), rec
	})
	ctx := t.Context()
	gv := testPod("gv", "img")
	rc := "gvisor"
	gv.Spec.RuntimeClassName = &rc
	plain := testPod("plain", "img")
	for _, pod := range []*corev1.Pod{gv, plain} {
		if err := h.p.CreatePod(ctx, pod); err != nil {
			t.Fatal(err)
		}
		h.wait(t, pod.UID, pod.Name+" ready", isReady)
	}
	slotState := func(uid string) runtime.SlotState {
		inv, _ := h.node.Inventory(ctx)
		for _, s := range inv.Slots {
			if s.Pod != nil && s.Pod.UID == uid {
				return s.State
			}
		}
		return ""
	}

	ask := func(pod *corev1.Pod, paused bool) {
		t.Helper()
		pod = pod.DeepCopy()
		if paused {
			pod.Annotations[podcontract.AnnotationPause] = "true"
		} else {
			delete(pod.Annotations, podcontract.AnnotationPause)
		}
		if err := h.p.UpdatePod(ctx, pod); err != nil {
			t.Fatal(err)
		}
	}
	ask(gv, true)
	got := h.wait(t, gv.UID, "gv paused", func(p *corev1.Pod) bool {
		c, ok := pausedCondition(p)
		return ok && c.Status == corev1.ConditionTrue && c.Reason == podcontract.ReasonPaused
	})
	if isReady(got) || got.Status.Reason != podcontract.ReasonPaused || got.Status.Phase != corev1.PodRunning {
		t.Errorf("paused pod: ready %v, reason %q, phase %s", isReady(got), got.Status.Reason, got.Status.Phase)
	}
	if st := slotState(string(gv.UID)); st != runtime.StatePaused {
		t.Errorf("the paused pod's slot is %q", st)
	}
	ask(gv, false)
	got = h.wait(t, gv.UID, "gv resumed and ready", func(p *corev1.Pod) bool {
		c, ok := pausedCondition(p)
		return ok && c.Status == corev1.ConditionFalse && c.Reason == podcontract.ReasonResumed && isReady(p)
	})
	if got.Status.Reason != "" {
		t.Errorf("resumed pod's status reason %q", got.Status.Reason)
	}

	ask(plain, true)
	h.wait(t, plain.UID, "plain's pause refused", func(p *corev1.Pod) bool {
		c, ok := pausedCondition(p)
		return ok && c.Status == corev1.ConditionFalse && c.Reason == podcontract.ReasonPauseFailed &&
			strings.Contains(c.Message, "CRIU") && isReady(p)
	})
	var events []string
	poll(t, "the events", func() bool {
		select {
		case e := <-rec.Events:
			events = append(events, e)
		default:
		}
		s := strings.Join(events, "\n")
		return strings.Contains(s, "Normal Paused") && strings.Contains(s, "Normal Resumed") && strings.Contains(s, "Warning PauseFailed")
	})
}

// TestForkAnnotation: a pod that names a running gVisor sandbox in
// sandman.io/fork-of is bound as its fork (the fork ID its annotation's,
// or its UID); one that names a runc sandbox, a pod that is not there, or
// a paused one fails with a reason that says so.
func TestForkAnnotation(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	if err := idx.Add(&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "runsc"}); err != nil {
		t.Fatal(err)
	}
	rec := record.NewFakeRecorder(100)
	h := newHarness(t, 6, func(c *Config) {
		c.RuntimeClasses, c.Recorder = nodev1listers.NewRuntimeClassLister(idx), rec
	})
	ctx := t.Context()
	rc := "gvisor"
	gvisorPod := func(name string, mutate ...func(*corev1.Pod)) *corev1.Pod {
		pod := testPod(name, "img")
		pod.Spec.RuntimeClassName = &rc
		for _, m := range mutate {
			m(pod)
		}
		return pod
	}
	forkOf := func(source, id string) func(*corev1.Pod) {
		return func(pod *corev1.Pod) {
			pod.Annotations[podcontract.AnnotationForkOf] = source
			if id != "" {
				pod.Annotations[podcontract.AnnotationForkID] = id
			}
		}
	}
	src, plain := gvisorPod("src"), testPod("plain", "img")
	for _, pod := range []*corev1.Pod{src, plain} {
		if err := h.p.CreatePod(ctx, pod); err != nil {
			t.Fatal(err)
		}
		h.wait(t, pod.UID, pod.Name+" ready", isReady)
	}
	f1, f2 := gvisorPod("f1", forkOf("src", "batch")), gvisorPod("f2", forkOf("src", ""))
	for _, pod := range []*corev1.Pod{f1, f2} {
		if err := h.p.CreatePod(ctx, pod); err != nil {
			t.Fatal(err)
		}
		h.wait(t, pod.UID, pod.Name+" ready", isReady)
	}
	h.p.mu.Lock()
	got1, got2 := h.p.byUID[string(f1.UID)].req.Fork, h.p.byUID[string(f2.UID)].req.Fork
	h.p.mu.Unlock()
	if got1 == nil || got1.PodUID != string(src.UID) || got1.ID != "batch" {
		t.Errorf("f1's fork: %+v, want source %s, ID batch", got1, src.UID)
	}
	if got2 == nil || got2.ID != string(f2.UID) {
		t.Errorf("f2's fork: %+v, want its UID as the ID", got2)
	}

	bad := map[string]*corev1.Pod{
		"runc":                  gvisorPod("of-runc", forkOf("plain", "")),
		"not a running sandbox": gvisorPod("of-nobody", forkOf("nobody", "")),
	}
	for want, pod := range bad {
		if err := h.p.CreatePod(ctx, pod); err != nil {
			t.Fatal(err)
		}
		got := h.wait(t, pod.UID, pod.Name+" failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
		if got.Status.Reason != runtime.ReasonInvalidSpec || !strings.Contains(got.Status.Message, want) {
			t.Errorf("%s: %s %q, want InvalidSpec saying %q", pod.Name, got.Status.Reason, got.Status.Message, want)
		}
	}
}

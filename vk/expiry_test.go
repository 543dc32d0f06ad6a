package vk

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	nodev1 "k8s.io/api/node/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	nodev1listers "k8s.io/client-go/listers/node/v1"
	"k8s.io/client-go/tools/cache"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/sandman-dev/sandman/podcontract"
)

// TestExpiryPause: a gVisor pod with sandman.io/on-expiry=pause is paused
// at its expiry, not deleted, and kept paused for KeepPaused; a call
// through the virtual node resumes it (sandman.io/resume-on-call) for that
// long again; at its next expiry it is paused again, and at the end of its
// keep time, still paused, deleted. Pods that cannot honour the
// annotations fail with a message naming them.
func TestExpiryPause(t *testing.T) {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	if err := idx.Add(&nodev1.RuntimeClass{ObjectMeta: metav1.ObjectMeta{Name: "gvisor"}, Handler: "runsc"}); err != nil {
		t.Fatal(err)
	}
	clk := clocktesting.NewFakeClock(time.Now())
	h := newHarness(t, 2, func(c *Config) {
		c.RuntimeClasses, c.Clock, c.KeepPaused = nodev1listers.NewRuntimeClassLister(idx), clk, time.Hour
	})
	ctx := t.Context()
	rc := "gvisor"
	pod := testPod("lives-on", "img")
	pod.Spec.RuntimeClassName = &rc
	pod.Annotations[podcontract.AnnotationOnExpiry] = podcontract.OnExpiryPause
	pod.Annotations[podcontract.AnnotationResumeOnCall] = "5m"
	pod.Annotations[podcontract.AnnotationExpiresAt] = clk.Now().Add(time.Minute).UTC().Format(time.RFC3339)
	if _, err := h.client.CoreV1().Pods("ns").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.p.CreatePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	h.wait(t, pod.UID, "Ready", isReady)

	// current is the pod as the API holds it, handed to the provider as
	// its informer would.
	current := func() *corev1.Pod {
		t.Helper()
		got, err := h.client.CoreV1().Pods("ns").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatalf("the pod: %v", err)
		}
		if err := h.p.UpdatePod(ctx, got); err != nil {
			t.Fatal(err)
		}
		return got
	}
	annotation := func(key string) string {
		got, err := h.client.CoreV1().Pods("ns").Get(ctx, pod.Name, metav1.GetOptions{})
		if err != nil {
			return "<" + err.Error() + ">"
		}
		return got.Annotations[key]
	}
	pausedAtExpiry := func(after time.Duration) {
		t.Helper()
		expiry := clk.Now().Add(after).UTC().Truncate(time.Second)
		clk.Step(after + time.Second)
		poll(t, "the pause asked for at the expiry", func() bool { return annotation(podcontract.AnnotationPause) == podcontract.PauseIdle })
		got := current()
		if v := got.Annotations[podcontract.AnnotationPausedAtExpiry]; v == "" {
			t.Errorf("%s not set", podcontract.AnnotationPausedAtExpiry)
		}
		keep, err := time.Parse(time.RFC3339, got.Annotations[podcontract.AnnotationExpiresAt])
		if err != nil || keep.Before(clk.Now().Add(time.Hour-time.Second)) || keep.After(clk.Now().Add(time.Hour)) {
			t.Errorf("kept paused until %s (%v), want an hour from %s (expired at %s)", keep, err, clk.Now(), expiry)
		}
		h.wait(t, pod.UID, "paused", func(p *corev1.Pod) bool {
			c, ok := pausedCondition(p)
			return ok && c.Status == corev1.ConditionTrue && c.Reason == podcontract.ReasonPaused
		})
	}
	pausedAtExpiry(time.Minute)

	// A call through the virtual node (kubectl exec) resumes it.
	resumed := make(chan error, 1)
	go func() { resumed <- h.p.resumeForCall(context.Background(), "ns", pod.Name) }()
	poll(t, "the resume asked for by the call", func() bool { return annotation(podcontract.AnnotationPause) == "" })
	got := current()
	if err := <-resumed; err != nil {
		t.Fatalf("the call's resume: %v", err)
	}
	if v := got.Annotations[podcontract.AnnotationPausedAtExpiry]; v != "" {
		t.Errorf("%s left after the resume: %q", podcontract.AnnotationPausedAtExpiry, v)
	}
	if want := clk.Now().Add(5 * time.Minute).UTC().Truncate(time.Second).Format(time.RFC3339); got.Annotations[podcontract.AnnotationExpiresAt] != want {
		t.Errorf("expiry after the resume %q, want %q (resume-on-call from now)", got.Annotations[podcontract.AnnotationExpiresAt], want)
	}
	h.wait(t, pod.UID, "Ready again", isReady)

	// Its next expiry pauses it again; the keep time's end deletes it.
	pausedAtExpiry(5 * time.Minute)
	clk.Step(time.Hour + time.Second)
	poll(t, "the pod deleted at the end of its keep time", func() bool {
		_, err := h.client.CoreV1().Pods("ns").Get(ctx, pod.Name, metav1.GetOptions{})
		return err != nil
	})

	for _, c := range []struct {
		name, want  string
		gvisor      bool
		annotations map[string]string
	}{
		{"runc", "only a gVisor sandbox", false, map[string]string{podcontract.AnnotationOnExpiry: "pause"}},
		{"unknown", "is neither", true, map[string]string{podcontract.AnnotationOnExpiry: "hibernate"}},
		{"resume-alone", "needs " + podcontract.AnnotationOnExpiry, true, map[string]string{podcontract.AnnotationResumeOnCall: "5m"}},
		{"resume-bad", "not a positive duration", true, map[string]string{podcontract.AnnotationOnExpiry: "pause", podcontract.AnnotationResumeOnCall: "soon"}},
	} {
		bad := testPod(c.name, "img")
		if c.gvisor {
			bad.Spec.RuntimeClassName = &rc
		}
		for k, v := range c.annotations {
			bad.Annotations[k] = v
		}
		if err := h.p.CreatePod(ctx, bad); err != nil {
			t.Fatal(err)
		}
		got := h.wait(t, bad.UID, c.name+" Failed", func(p *corev1.Pod) bool { return p.Status.Phase == corev1.PodFailed })
		if !strings.Contains(got.Status.Message, c.want) {
			t.Errorf("%s: message %q does not say %q", c.name, got.Status.Message, c.want)
		}
	}
}

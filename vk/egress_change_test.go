package vk

import (
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"

	"github.com/sandman-dev/sandman/podcontract"
)

// TestEgressChange: new egress annotations on a running pod reach its
// sandbox's node, and the virtual node records their digest
// (sandman.io/egress-applied) with a Normal event; annotations that do not
// parse are a Warning event, and the sandbox keeps what it had.
func TestEgressChange(t *testing.T) {
	rec := record.NewFakeRecorder(100)
	h := newHarness(t, 1, func(c *Config) { c.Recorder = rec })
	ctx := t.Context()
	pod := testPod("net", "img")
	if _, err := h.client.CoreV1().Pods("ns").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.p.CreatePod(ctx, pod); err != nil {
		t.Fatal(err)
	}
	h.wait(t, pod.UID, "Ready", isReady)
	if _, ok := h.node.Egress(string(pod.UID)); ok {
		t.Fatal("the node was asked to change the egress of a pod that did not change")
	}

	changed := pod.DeepCopy()
	changed.Annotations[podcontract.AnnotationEgressDeny] = "203.0.113.0/24"
	changed.Annotations[podcontract.AnnotationEgressDomains] = "api.example.com"
	if err := h.p.UpdatePod(ctx, changed); err != nil {
		t.Fatal(err)
	}
	want := podcontract.EgressDigest(changed.Annotations)
	poll(t, "the change recorded on the pod", func() bool {
		got, err := h.client.CoreV1().Pods("ns").Get(ctx, pod.Name, metav1.GetOptions{})
		return err == nil && got.Annotations[podcontract.AnnotationEgressApplied] == want
	})
	e, ok := h.node.Egress(string(pod.UID))
	if !ok || !slices.Equal(e.EgressDeny, []string{"203.0.113.0/24"}) || !slices.Equal(e.EgressDomains, []string{"api.example.com"}) {
		t.Fatalf("the node has %+v (%v)", e, ok)
	}

	bad := changed.DeepCopy()
	bad.Annotations[podcontract.AnnotationEgress] = "everything"
	if err := h.p.UpdatePod(ctx, bad); err != nil {
		t.Fatal(err)
	}
	var events []string
	poll(t, "the events", func() bool {
		select {
		case ev := <-rec.Events:
			events = append(events, ev)
		default:
		}
		s := strings.Join(events, "\n")
		return strings.Contains(s, "Normal "+podcontract.ReasonEgressChanged) && strings.Contains(s, "Warning "+podcontract.ReasonEgressFailed+" annotation "+podcontract.AnnotationEgress)
	})
	if e2, _ := h.node.Egress(string(pod.UID)); !slices.Equal(e2.EgressDeny, e.EgressDeny) || len(e2.Egress) != 0 {
		t.Errorf("a refused change reached the node: %+v", e2)
	}
}

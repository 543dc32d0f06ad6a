package gateway

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandman-dev/sandman/podcontract"
)

// TestPauseResume: pause sets the pod's pause annotation and answers 204
// once the virtual node says Paused (simulated here); the sandbox lists
// and reads as paused, a second pause is 409; connect removes the
// annotation and answers 201 once it is Resumed and Ready; resume of a
// running sandbox is 409. A runc sandbox's pause, a pause without memory
// and another team's pause are refused, and change nothing.
func TestPauseResume(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	runc, _ := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base"})
	gv, _ := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base"})
	pods := e.client.CoreV1().Pods(nsA)
	pod, err := pods.Get(ctx, gv.SandboxID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	class := "gvisor"
	pod.Spec.RuntimeClassName = &class
	if _, err := pods.Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	annotated := func(id string) bool {
		p, err := pods.Get(ctx, id, metav1.GetOptions{})
		return err == nil && p.Annotations[podcontract.AnnotationPause] == "true"
	}

	for _, tc := range []struct {
		id, key string
		body    any
		status  int
		says    string
	}{
		{runc.SandboxID, rawKeyA, nil, http.StatusNotImplemented, "CRIU"},
		{gv.SandboxID, rawKeyA, map[string]any{"memory": false}, http.StatusNotImplemented, "keepMemory"},
		{gv.SandboxID, rawKeyB, nil, http.StatusNotFound, "not found"},
	} {
		r := e.call(http.MethodPost, "/sandboxes/"+tc.id+"/pause", tc.key, tc.body)
		if r.status != tc.status || !strings.Contains(r.apiError(t).Message, tc.says) {
			t.Errorf("pause %s: %d %s, want %d saying %q", tc.id, r.status, r.body, tc.status, tc.says)
		}
		if annotated(tc.id) {
			t.Errorf("a refused pause left %s annotated", tc.id)
		}
	}
	if r := e.call(http.MethodPost, "/sandboxes/"+gv.SandboxID+"/resume", rawKeyA, nil); r.status != http.StatusConflict {
		t.Errorf("resume of a running sandbox: %d %s", r.status, r.body)
	}

	// The pause, with the virtual node's answer simulated.
	p := e.startCreate("/sandboxes/"+gv.SandboxID+"/pause", rawKeyA, nil)
	poll(t, "the pause annotation", func() bool { return annotated(gv.SandboxID) })
	e.setStatus(nsA, gv.SandboxID, func(s *corev1.PodStatus) {
		s.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionFalse},
			{Type: podcontract.ConditionPaused, Status: corev1.ConditionTrue, Reason: podcontract.ReasonPaused}}
	})
	if r := p.wait(t); r.status != http.StatusNoContent {
		t.Fatalf("pause: %d %s", r.status, r.body)
	}
	var info sandboxDetail
	if r := e.call(http.MethodGet, "/sandboxes/"+gv.SandboxID, rawKeyA, nil); r.status != http.StatusOK {
		t.Fatalf("get: %d", r.status)
	} else if r.decode(t, &info); info.State != statePaused {
		t.Errorf("a paused sandbox reads as %q", info.State)
	}
	if r := e.call(http.MethodPost, "/sandboxes/"+gv.SandboxID+"/pause", rawKeyA, nil); r.status != http.StatusConflict {
		t.Errorf("second pause: %d %s", r.status, r.body)
	}
	listed := func(state string) []string {
		var ids []string
		poll(t, "the list", func() bool {
			var list []listedSandbox
			r := e.call(http.MethodGet, "/v2/sandboxes?state="+state, rawKeyA, nil)
			r.decode(t, &list)
			ids = nil
			for _, s := range list {
				ids = append(ids, s.SandboxID)
			}
			return len(ids) == 1
		})
		return ids
	}
	if ids := listed(statePaused); ids[0] != gv.SandboxID {
		t.Errorf("paused sandboxes: %v", ids)
	}
	if ids := listed(stateRunning); ids[0] != runc.SandboxID {
		t.Errorf("running sandboxes: %v", ids)
	}

	// Connect resumes it: 201 once Resumed and Ready.
	c := e.startCreate("/v2/sandboxes/"+gv.SandboxID+"/connect", rawKeyA, map[string]any{"timeout": 60})
	poll(t, "the annotation removed", func() bool { return !annotated(gv.SandboxID) })
	e.setStatus(nsA, gv.SandboxID, func(s *corev1.PodStatus) {
		s.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue},
			{Type: podcontract.ConditionPaused, Status: corev1.ConditionFalse, Reason: podcontract.ReasonResumed}}
	})
	r := c.wait(t)
	var sb sandboxJSON
	if r.status != http.StatusCreated {
		t.Fatalf("connect of a paused sandbox: %d %s", r.status, r.body)
	}
	if r.decode(t, &sb); sb.EnvdAccessToken != gv.EnvdAccessToken {
		t.Errorf("connect after the resume gave another token")
	}
	// It runs for the connect's timeout from the resume, not until the
	// end it was kept paused for.
	if p, err := pods.Get(ctx, gv.SandboxID, metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if want := e.gw.cfg.Now().Add(time.Minute).UTC().Truncate(time.Second); !expiresAt(p).Equal(want) {
		t.Errorf("after a connect with timeout 60 the sandbox ends at %s, want %s", expiresAt(p), want)
	}
	if r := e.call(http.MethodPost, "/v2/sandboxes/"+gv.SandboxID+"/connect", rawKeyA, nil); r.status != http.StatusOK {
		t.Errorf("connect of a running sandbox: %d %s", r.status, r.body)
	}
}

func TestTemplateRuntimeClass(t *testing.T) {
	got, errs := ParseTemplates(map[string]string{
		"gv":  `{"image":"i","runtimeClassName":"gvisor"}`,
		"bad": `{"image":"i","runtimeClassName":"Not_A_Name"}`,
	})
	if got["gv"].RuntimeClass != "gvisor" {
		t.Errorf("gv's runtime class: %q", got["gv"].RuntimeClass)
	}
	if _, ok := got["bad"]; ok || len(errs) != 1 || !strings.Contains(errs[0].Error(), "runtimeClassName") {
		t.Errorf("a bad runtimeClassName: %v %v", got["bad"], errs)
	}
}

// TestLifecycle: E2B's lifecycle onTimeout "pause" and autoResume become
// the pod's sandman.io/on-expiry and resume-on-call (the timeout), and
// getInfo reads them back; traffic for a sandbox its virtual node paused
// at its timeout resumes it for its timeout again. A runc template, a
// pause without memory and autoResume alone are refused, leaving no pod.
func TestLifecycle(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	sb, pod := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "gv", "timeout": 30, "autoPause": true, "autoResume": map[string]any{"enabled": true}})
	if a := pod.Annotations; a[podcontract.AnnotationOnExpiry] != podcontract.OnExpiryPause || a[podcontract.AnnotationResumeOnCall] != "30s" {
		t.Errorf("annotations %v", a)
	}
	var info sandboxDetail
	if r := e.call(http.MethodGet, "/sandboxes/"+sb.SandboxID, rawKeyA, nil); r.status != http.StatusOK {
		t.Fatalf("get: %d", r.status)
	} else if r.decode(t, &info); info.Lifecycle != (lifecycle{AutoResume: true, OnTimeout: "pause"}) {
		t.Errorf("lifecycle %+v", info.Lifecycle)
	}

	// The virtual node paused it at its timeout (simulated).
	pods := e.client.CoreV1().Pods(nsA)
	cur, err := pods.Get(ctx, sb.SandboxID, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cur.Annotations[podcontract.AnnotationPause] = podcontract.PauseIdle
	cur.Annotations[podcontract.AnnotationPausedAtExpiry] = time.Now().UTC().Format(time.RFC3339)
	cur.Annotations[podcontract.AnnotationExpiresAt] = time.Now().Add(24 * time.Hour).UTC().Format(time.RFC3339)
	if cur, err = pods.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	resumed := make(chan *corev1.Pod, 1)
	go func() { resumed <- e.gw.resumeIdle(ctx, cur) }()
	poll(t, "the pause annotation removed", func() bool {
		p, err := pods.Get(ctx, sb.SandboxID, metav1.GetOptions{})
		return err == nil && p.Annotations[podcontract.AnnotationPause] == ""
	})
	e.setStatus(nsA, sb.SandboxID, func(s *corev1.PodStatus) {
		s.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue},
			{Type: podcontract.ConditionPaused, Status: corev1.ConditionFalse, Reason: podcontract.ReasonResumed}}
	})
	got := <-resumed
	if v := got.Annotations[podcontract.AnnotationPausedAtExpiry]; v != "" {
		t.Errorf("%s left after the resume: %q", podcontract.AnnotationPausedAtExpiry, v)
	}
	if want := e.gw.cfg.Now().Add(30 * time.Second).UTC().Truncate(time.Second); !expiresAt(got).Equal(want) {
		t.Errorf("resumed on traffic, the sandbox ends at %s, want its timeout (30 s) from now, %s", expiresAt(got), want)
	}

	before := len(e.sandboxPods(nsA))
	for _, tc := range []struct {
		body   map[string]any
		status int
		says   string
	}{
		{map[string]any{"templateID": "base", "autoPause": true}, http.StatusNotImplemented, "CRIU"},
		{map[string]any{"templateID": "gv", "autoPause": true, "autoPauseMemory": false}, http.StatusNotImplemented, "keepMemory"},
		{map[string]any{"templateID": "gv", "autoResume": map[string]any{"enabled": true}}, http.StatusBadRequest, "autoPause"},
	} {
		r := e.call(http.MethodPost, "/v2/sandboxes", rawKeyA, tc.body)
		if r.status != tc.status || !strings.Contains(r.apiError(t).Message, tc.says) {
			t.Errorf("create %v: %d %s, want %d saying %q", tc.body, r.status, r.body, tc.status, tc.says)
		}
	}
	if n := len(e.sandboxPods(nsA)); n != before {
		t.Errorf("refused creates left %d pods", n-before)
	}
}

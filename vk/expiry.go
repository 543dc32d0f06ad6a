package vk

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
)

// A sandbox paused at its expiry (podcontract.AnnotationOnExpiry "pause"):
// at its sandman.io/expires-at the provider sets the pod's AnnotationPause
// (PauseIdle when it resumes on a call), AnnotationPausedAtExpiry and a
// new expiry KeepPaused away, in one patch; the pause then runs as any
// other. At that new expiry a sandbox still paused is deleted; one running
// again is paused again. A pause that fails at an expiry deletes the
// sandbox, as the expiry would have.

// DefaultKeepPaused is Config.KeepPaused's default.
const DefaultKeepPaused = 24 * time.Hour

// What an expiry does to a sandbox.
type expiryAction int

const (
	expiryDelete expiryAction = iota
	expiryPause
	// expiryWait: not now (a resume under way, a pause asked for already,
	// a sandbox briefly not Ready); the reconciler asks again.
	expiryWait
)

// checkExpiryPolicy refuses an AnnotationOnExpiry or AnnotationResumeOnCall
// the pod cannot have: an unknown value, a pause for a sandbox that cannot
// be paused, or a resume on call without the pause.
func checkExpiryPolicy(pod *corev1.Pod, req runtime.BindRequest) error {
	a := pod.Annotations
	v, pausing := a[podcontract.AnnotationOnExpiry], false
	switch v {
	case "", podcontract.OnExpiryDelete:
	case podcontract.OnExpiryPause:
		pausing = true
	default:
		return fmt.Errorf("annotation %s: %q is neither %q nor %q", podcontract.AnnotationOnExpiry, v, podcontract.OnExpiryDelete, podcontract.OnExpiryPause)
	}
	if pausing && (!req.GVisor() || len(req.Containers) != 1) {
		return fmt.Errorf("annotation %s: %q: only a gVisor sandbox (RuntimeClass gvisor) of one container can be paused, and this pod's cannot; leave it at %q (the default)",
			podcontract.AnnotationOnExpiry, v, podcontract.OnExpiryDelete)
	}
	r, ok := a[podcontract.AnnotationResumeOnCall]
	if !ok {
		return nil
	}
	if !pausing {
		return fmt.Errorf("annotation %s needs %s: %q: only a sandbox paused at its expiry resumes on a call", podcontract.AnnotationResumeOnCall, podcontract.AnnotationOnExpiry, podcontract.OnExpiryPause)
	}
	if d, err := time.ParseDuration(r); err != nil || d <= 0 {
		return fmt.Errorf("annotation %s: %q is not a positive duration such as 5m", podcontract.AnnotationResumeOnCall, r)
	}
	return nil
}

// expiryActionLocked is what the sandbox's expiry, reached, does now. The
// caller holds mu.
func (p *Provider) expiryActionLocked(sb *sandbox) expiryAction {
	pod := sb.pod
	switch {
	case pod.Annotations[podcontract.AnnotationOnExpiry] != podcontract.OnExpiryPause,
		!sb.req.GVisor() || len(sb.req.Containers) != 1:
		return expiryDelete
	case sb.moving && !sb.terminal():
		// Being restored on another node: paused once it runs there.
		return expiryWait
	case sb.terminal() || sb.slot.ID == "" && !sb.offNode || !sb.started():
		return expiryDelete
	case sb.pauseOp == podcontract.ReasonResuming:
		return expiryWait
	case sb.paused || wantPaused(pod):
		// Kept paused as long as it was to be.
		return expiryDelete
	case sb.pauseOp != "" || !sb.isReady || sb.pausingAtExpiry.Equal(sb.expiresAt):
		return expiryWait
	}
	return expiryPause
}

// pauseAtExpiry asks for the sandbox of a pod past its expiry at to be
// paused and kept KeepPaused (one patch, naming the pod's UID).
func (p *Provider) pauseAtExpiry(ctx context.Context, uid string, pod *corev1.Pod, at time.Time) {
	value := "true"
	if podcontract.ResumeOnCall(pod.Annotations) > 0 {
		value = podcontract.PauseIdle
	}
	keep := p.cfg.Now().Add(p.cfg.KeepPaused).UTC().Truncate(time.Second)
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid": pod.UID, "annotations": map[string]string{
			podcontract.AnnotationPause:          value,
			podcontract.AnnotationPausedAtExpiry: at.UTC().Format(time.RFC3339),
			podcontract.AnnotationExpiresAt:      keep.Format(time.RFC3339),
		},
	}})
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := p.cfg.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil {
		if !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			p.log.Warn("pause at expiry", "pod", podKey(pod.Namespace, pod.Name), "err", err)
		}
		p.mu.Lock()
		if sb := p.byUID[uid]; sb != nil {
			sb.pausingAtExpiry = time.Time{} // the reconciler tries again
		}
		p.mu.Unlock()
		return
	}
	msg := fmt.Sprintf("the sandbox expired at %s (annotation %s): it is paused instead (%s: %s) and kept paused until %s",
		at.UTC().Format(time.RFC3339), podcontract.AnnotationExpiresAt, podcontract.AnnotationOnExpiry, podcontract.OnExpiryPause, keep.Format(time.RFC3339))
	p.log.Info("pause at expiry", "pod", podKey(pod.Namespace, pod.Name), "at", at, "keep_until", keep)
	p.cfg.Recorder.Event(pod, corev1.EventTypeNormal, podcontract.ReasonExpired, msg)
}

// afterExpiryPauseOp finishes what a pause or resume of a sandbox paused at
// its expiry leaves: a pause that failed deletes it, as the expiry would
// have; a resume removes AnnotationPausedAtExpiry. Other pods are left
// alone.
func (p *Provider) afterExpiryPauseOp(pod *corev1.Pod, op string, err error) {
	at := pod.Annotations[podcontract.AnnotationPausedAtExpiry]
	switch {
	case at == "":
	case op == podcontract.ReasonPausing && err != nil:
		p.deleteReclaimed(p.ctx, pod, fmt.Sprintf("the sandbox expired at %s (annotation %s) and could not be paused (%v): it was reclaimed", at, podcontract.AnnotationExpiresAt, err))
	case op == podcontract.ReasonResuming && err == nil:
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
			"uid": pod.UID, "annotations": map[string]any{podcontract.AnnotationPausedAtExpiry: nil},
		}})
		ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
		defer cancel()
		if _, err := p.cfg.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			p.log.Warn("resumed after a pause at expiry", "pod", podKey(pod.Namespace, pod.Name), "err", err)
		}
	}
}

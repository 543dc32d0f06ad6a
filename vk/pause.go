package vk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	vkerrdefs "github.com/virtual-kubelet/virtual-kubelet/errdefs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
)

// Pause and resume from the pod: its podcontract.AnnotationPause says
// whether its sandbox should be paused; the provider makes the sandbox
// follow (Pool.Pause, Pool.Resume), one operation at a time per pod, and
// reports it in the pod's status (podcontract.ConditionPaused, the status's
// reason while paused) and events.

// pauseTimeout bounds one pause or resume.
const pauseTimeout = 5 * time.Minute

// resumeRetry is how long a resume that found no room on the node waits
// before it is tried again.
const resumeRetry = 2 * time.Second

// wantPaused reports whether the pod asks for its sandbox paused (by
// hand, or by the virtual node after it sat idle).
func wantPaused(pod *corev1.Pod) bool {
	v := pod.Annotations[podcontract.AnnotationPause]
	return v == "true" || v == podcontract.PauseIdle
}

// autoPause asks for a sandbox idle for idle to be paused: its pod's
// AnnotationPause becomes PauseIdle (the patch names the pod's UID: a new
// pod of the same name is left alone).
func (p *Provider) autoPause(ctx context.Context, pod *corev1.Pod, idle time.Duration) {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid": pod.UID, "annotations": map[string]string{podcontract.AnnotationPause: podcontract.PauseIdle},
	}})
	_, err := p.cfg.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		p.log.Warn("auto-pause", "pod", podKey(pod.Namespace, pod.Name), "err", err)
		return
	}
	if err == nil {
		p.log.Info("auto-pause", "pod", podKey(pod.Namespace, pod.Name), "idle", idle)
	}
}

// resumeForCall makes sure the sandbox a call through the virtual node
// (kubectl exec, port-forward) goes to is running: one the virtual node
// paused after it sat idle is resumed first (its annotation removed, then
// waited for until Ready); one paused by hand is an error saying so.
func (p *Provider) resumeForCall(ctx context.Context, namespace, name string) error {
	p.mu.Lock()
	sb := p.byUID[p.byKey[podKey(namespace, name)]]
	if sb == nil || sb.terminal() || !sb.paused && sb.pauseOp == "" {
		p.mu.Unlock()
		return nil
	}
	pod := sb.pod
	p.mu.Unlock()
	if pod.Annotations[podcontract.AnnotationPause] != podcontract.PauseIdle {
		if !wantPaused(pod) {
			return p.waitRunning(ctx, namespace, name) // resuming already
		}
		return vkerrdefs.InvalidInputf("pod %s/%s is paused (%s=%s): resume it first (sandmanctl resume, or remove the annotation)",
			namespace, name, podcontract.AnnotationPause, pod.Annotations[podcontract.AnnotationPause])
	}
	annotations := map[string]any{podcontract.AnnotationPause: nil}
	if d := podcontract.ResumeOnCall(pod.Annotations); d > 0 && pod.Annotations[podcontract.AnnotationPausedAtExpiry] != "" {
		// Paused at its expiry: it runs for its resume time again.
		annotations[podcontract.AnnotationPausedAtExpiry] = nil
		annotations[podcontract.AnnotationExpiresAt] = p.cfg.Now().Add(d).UTC().Truncate(time.Second).Format(time.RFC3339)
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"uid": pod.UID, "annotations": annotations}})
	if _, err := p.cfg.Client.CoreV1().Pods(namespace).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("resume pod %s/%s, paused after it sat idle: %w", namespace, name, err)
	}
	p.log.Info("auto-resume", "pod", podKey(namespace, name))
	return p.waitRunning(ctx, namespace, name)
}

// waitRunning waits until a resuming sandbox is Ready again.
func (p *Provider) waitRunning(ctx context.Context, namespace, name string) error {
	ctx, cancel := context.WithTimeout(ctx, pauseTimeout)
	defer cancel()
	for {
		p.mu.Lock()
		sb := p.byUID[p.byKey[podKey(namespace, name)]]
		var done bool
		var why string
		switch {
		case sb == nil || sb.terminal():
			done, why = true, "it ended"
		case !sb.paused && sb.pauseOp == "" && sb.isReady:
			done = true
		}
		p.mu.Unlock()
		if done && why != "" {
			return vkerrdefs.InvalidInputf("pod %s/%s: %s while it was resumed", namespace, name, why)
		}
		if done {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("pod %s/%s: not resumed: %w", namespace, name, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// reconcilePauseLocked starts a pause or a resume when the pod asks for
// what its sandbox is not. A pause waits for the sandbox to be Ready (it
// is tried again then). The caller holds mu.
func (p *Provider) reconcilePauseLocked(uid string, sb *sandbox) {
	if sb.pauseOp != "" || sb.terminal() || sb.deleting || sb.awaiting || sb.slot.ID == "" && !sb.offNode {
		return
	}
	want := wantPaused(sb.pod)
	if want == sb.paused || want && !sb.isReady || want && sb.pauseRefused {
		return
	}
	op := podcontract.ReasonResuming
	if want {
		op = podcontract.ReasonPausing
	}
	sb.pauseOp, sb.pauseMessage = op, ""
	sb.pauseSince = p.cfg.Now()
	p.owned.Go(func() { p.runPause(uid, op) })
	p.push(uid)
}

// runPause pauses or resumes a pod's sandbox (op is ReasonPausing or
// ReasonResuming) and records the outcome, then reconciles again: the pod
// may have changed its mind meanwhile.
func (p *Provider) runPause(uid, op string) {
	ctx, cancel := context.WithTimeout(p.ctx, pauseTimeout)
	defer cancel()
	var msg string
	var err error
	if op == podcontract.ReasonPausing {
		var bytes int64
		if res, perr := p.cfg.Pool.Pause(ctx, uid); perr == nil {
			bytes = res.Bytes
		} else {
			err = perr
		}
		msg = fmt.Sprintf("the sandbox is paused: its running state (%.1f MiB) is checkpointed on node %s", float64(bytes)/(1<<20), p.nodeOf(types.UID(uid)))
	} else if p.isOffNode(uid) {
		var node string
		node, err = p.resumeMoved(ctx, uid)
		msg = fmt.Sprintf("the sandbox runs again on node %s, restored from its checkpoint where it was paused", node)
	} else {
		err = p.cfg.Pool.Resume(ctx, uid)
		msg = "the sandbox runs again where it was paused"
		if errdefs.IsResourceExhausted(err) && p.moveForResume(ctx, uid) {
			err = fmt.Errorf("%w (%v)", errMovedToResume, err)
		}
	}
	p.mu.Lock()
	sb := p.byUID[uid]
	if sb == nil {
		p.mu.Unlock()
		return
	}
	pod := sb.pod
	sb.pauseOp = ""
	var event func()
	var retry bool
	retryAfter := resumeRetry
	switch {
	case err == nil && op == podcontract.ReasonPausing:
		sb.paused, sb.isReady, sb.pauseMessage, sb.pauseSince = true, false, msg, p.cfg.Now()
		sb.pauses++
		event = func() { p.cfg.Recorder.Event(pod, corev1.EventTypeNormal, podcontract.ReasonPaused, msg) }
	case err == nil:
		sb.paused, sb.pauseMessage, sb.pauseSince, sb.moveAsked = false, msg, p.cfg.Now(), false
		// Its daemon's last call is from before the pause: the call that
		// resumed it has a full idle period to arrive before the next
		// check could pause it again.
		sb.nextIdleCheck = p.cfg.Now().Add(max(p.cfg.AutoPauseAfter, time.Second))
		event = func() { p.cfg.Recorder.Event(pod, corev1.EventTypeNormal, podcontract.ReasonResumed, msg) }
	case op == podcontract.ReasonPausing:
		// The sandbox runs on. The pause is not tried again until the
		// pod asks to run, then to pause again.
		sb.pauseMessage, sb.pauseRefused = "pause failed, the sandbox runs on: "+err.Error(), true
		m := sb.pauseMessage
		event = func() { p.cfg.Recorder.Event(pod, corev1.EventTypeWarning, podcontract.ReasonPauseFailed, m) }
	case errdefs.IsDataLoss(err):
		m := "resume failed: the sandbox's checkpoint cannot be restored: " + err.Error()
		sb.fail(podcontract.ReasonResumeFailed, m, p.cfg.Now())
		event = func() { p.cfg.Recorder.Event(pod, corev1.EventTypeWarning, podcontract.ReasonResumeFailed, m) }
		key := podKey(pod.Namespace, pod.Name)
		p.owned.Go(func() { p.release(key, uid, 0, false) })
	case errors.Is(err, errMovedToResume):
		// Off its full node: the resume is a bind, in the pool's queue.
		sb.pauseMessage = "waiting to resume: " + err.Error()
		retry, retryAfter = true, time.Millisecond
	default:
		// No room on the node yet, or the agent did not answer: the
		// sandbox stays paused and the resume is tried again.
		sb.pauseMessage = "waiting to resume: " + err.Error()
		retry = true
	}
	if !wantPaused(sb.pod) {
		sb.pauseRefused = false
	}
	if retry {
		p.afterFuncLocked(retryAfter, func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if sb := p.byUID[uid]; sb != nil {
				p.reconcilePauseLocked(uid, sb)
			}
		})
	} else {
		p.reconcilePauseLocked(uid, sb)
	}
	p.mu.Unlock()
	if err != nil {
		p.log.Info("pause or resume failed", "op", op, "uid", uid, "err", err)
	}
	if event != nil {
		event()
	}
	p.push(uid)
	if !retry {
		p.afterExpiryPauseOp(pod, op, err)
	}
}

// errMovedToResume: a resume found no room on the sandbox's node, which
// moved it off (runtime.Mover) to be restored wherever the pool places it.
var errMovedToResume = errors.New("no room on its node: moved off it, to resume wherever the pool places it")

// moveForResume moves a paused sandbox off its node, which has no room to
// resume it (a node without a checkpoint repository cannot: false), and
// waits until the node's Moved update made it offNode.
func (p *Provider) moveForResume(ctx context.Context, uid string) bool {
	if _, err := p.cfg.Pool.Move(ctx, uid); err != nil {
		p.log.Debug("no move for a resume that found no room", "uid", uid, "err", err)
		return false
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for !p.isOffNode(uid) {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
	return true
}

// isOffNode: the pod's sandbox moved while paused and no node holds it.
func (p *Provider) isOffNode(uid string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	sb := p.byUID[uid]
	return sb != nil && sb.offNode
}

// pauseCondition is the pod's ConditionPaused, or false when its sandbox
// was never asked to pause.
func (s *sandbox) pauseCondition() (corev1.PodCondition, bool) {
	if !s.paused && s.pauseOp == "" && s.pauseMessage == "" {
		return corev1.PodCondition{}, false
	}
	c := corev1.PodCondition{Type: podcontract.ConditionPaused, Status: corev1.ConditionFalse,
		Message: s.pauseMessage, LastTransitionTime: metav1.NewTime(s.pauseSince.Truncate(time.Second))}
	switch {
	case s.pauseOp == podcontract.ReasonPausing:
		c.Reason, c.Message = podcontract.ReasonPausing, "checkpointing the sandbox's running state"
	case s.pauseOp == podcontract.ReasonResuming:
		c.Status, c.Reason, c.Message = corev1.ConditionTrue, podcontract.ReasonResuming, "restoring the sandbox from its checkpoint"
		if s.offNode && s.node == "" {
			c.Message = "waiting in the pool's queue for a node with room to restore the sandbox on"
		}
	case s.paused:
		c.Status, c.Reason = corev1.ConditionTrue, podcontract.ReasonPaused
	case wantPaused(s.pod) && s.pauseRefused:
		c.Reason = podcontract.ReasonPauseFailed
	default:
		c.Reason = podcontract.ReasonResumed
	}
	return c, true
}

// forkSourceLocked is the fork a pod asks for (podcontract.AnnotationForkOf),
// nil when it asks for none: the source must be a running gVisor sandbox on
// this virtual node, in the pod's namespace. The node checks the rest (the
// same image, one container) when it takes the checkpoint.
func (p *Provider) forkSourceLocked(pod *corev1.Pod) (*runtime.ForkSource, error) {
	name, ok := pod.Annotations[podcontract.AnnotationForkOf]
	if !ok {
		return nil, nil
	}
	src := p.byUID[p.byKey[podKey(pod.Namespace, name)]]
	switch {
	case src == nil || src.terminal() || src.deleting:
		return nil, fmt.Errorf("annotation %s: pod %s/%s is not a running sandbox on virtual node %s (a fork starts on its source's virtual node: give the fork spec.nodeName %s)",
			podcontract.AnnotationForkOf, pod.Namespace, name, p.cfg.NodeName, p.cfg.NodeName)
	case !src.req.GVisor():
		return nil, fmt.Errorf("annotation %s: sandbox %s/%s runs under runc: only gVisor sandboxes (RuntimeClass gvisor) fork with their processes and memory; a runc sandbox's would need CRIU, which sandman's nodes do not have",
			podcontract.AnnotationForkOf, pod.Namespace, name)
	case src.paused || src.pauseOp != "":
		return nil, fmt.Errorf("annotation %s: sandbox %s/%s is paused: resume it before forking it", podcontract.AnnotationForkOf, pod.Namespace, name)
	case !src.started() || !src.isReady:
		return nil, fmt.Errorf("annotation %s: sandbox %s/%s is not Ready yet: fork it once it is", podcontract.AnnotationForkOf, pod.Namespace, name)
	}
	id := pod.Annotations[podcontract.AnnotationForkID]
	if id == "" {
		id = string(pod.UID)
	}
	return &runtime.ForkSource{PodUID: string(src.pod.UID), ID: id}, nil
}

package vk

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
)

// A running pod's egress annotations may change (sandman-gateway's E2B
// updateNetwork, or kubectl annotate): the provider has the pool change
// its sandbox's egress (Pool.SetEgress), one change at a time per pod,
// then writes podcontract.AnnotationEgressApplied and a Normal event. A
// change that does not parse, or that the node refuses, is a Warning
// event; the sandbox keeps the egress it had, and the same annotations
// are not tried again.

// egressTimeout bounds one egress change; egressRetry is how long a change
// of a pod being bound waits before it is asked again.
const (
	egressTimeout = 30 * time.Second
	egressRetry   = time.Second
)

// reconcileEgressLocked starts an egress change when the pod's annotations
// say other than what its sandbox has. The caller holds mu.
func (p *Provider) reconcileEgressLocked(uid string, sb *sandbox) {
	if sb.egressOp || sb.egressApplied == "" || sb.terminal() || sb.deleting || sb.awaiting {
		return
	}
	want := podcontract.EgressDigest(sb.pod.Annotations)
	if want == sb.egressApplied || want == sb.egressRefused {
		return
	}
	pod := sb.pod
	e, err := egressOf(pod)
	if err != nil {
		sb.egressRefused = want
		p.owned.Go(func() {
			p.cfg.Recorder.Event(pod, corev1.EventTypeWarning, podcontract.ReasonEgressFailed, err.Error()+"; the sandbox keeps the egress it had")
		})
		return
	}
	sb.egressOp = true
	p.owned.Go(func() { p.applyEgress(uid, pod, e, want) })
}

// applyEgress has the pool change the pod's egress to e (its annotations'
// digest want), then records the outcome and reconciles again.
func (p *Provider) applyEgress(uid string, pod *corev1.Pod, e runtime.Egress, want string) {
	ctx, cancel := context.WithTimeout(p.ctx, egressTimeout)
	defer cancel()
	err := p.cfg.Pool.SetEgress(ctx, uid, e)
	p.mu.Lock()
	sb := p.byUID[uid]
	if sb == nil {
		p.mu.Unlock()
		return
	}
	sb.egressOp = false
	retry := errdefs.IsFailedPrecondition(err) && !sb.terminal() && !sb.deleting
	switch {
	case err == nil:
		sb.egressApplied, sb.egressRefused = want, ""
		sb.req.Egress, sb.req.EgressDeny, sb.req.EgressDomains = e.Egress, e.EgressDeny, e.EgressDomains
	case retry:
		// Being bound (or released): the change waits its turn.
		p.afterFuncLocked(egressRetry, func() {
			p.mu.Lock()
			defer p.mu.Unlock()
			if sb := p.byUID[uid]; sb != nil {
				p.reconcileEgressLocked(uid, sb)
			}
		})
	default:
		sb.egressRefused = want
	}
	if !retry {
		p.reconcileEgressLocked(uid, sb)
	}
	p.mu.Unlock()
	switch {
	case err == nil:
		p.log.Info("egress changed", "pod", podKey(pod.Namespace, pod.Name), "egress", e.Egress, "deny", e.EgressDeny, "domains", e.EgressDomains)
		p.cfg.Recorder.Event(pod, corev1.EventTypeNormal, podcontract.ReasonEgressChanged, "the sandbox's egress is now "+describeEgress(e))
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
			"uid": pod.UID, "annotations": map[string]string{podcontract.AnnotationEgressApplied: want},
		}})
		pctx, pcancel := context.WithTimeout(p.ctx, 10*time.Second)
		defer pcancel()
		if _, err := p.cfg.Client.CoreV1().Pods(pod.Namespace).Patch(pctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			p.log.Warn("record an egress change", "pod", podKey(pod.Namespace, pod.Name), "err", err)
		}
	case !retry:
		p.log.Info("egress change refused", "pod", podKey(pod.Namespace, pod.Name), "err", err)
		p.cfg.Recorder.Event(pod, corev1.EventTypeWarning, podcontract.ReasonEgressFailed, "the egress change was refused: "+err.Error()+"; the sandbox keeps the egress it had")
	}
}

// describeEgress says what e lets a sandbox reach, for an event.
func describeEgress(e runtime.Egress) string {
	var parts []string
	switch {
	case slices.Contains(e.EgressDeny, "0.0.0.0/0") && len(e.Egress) == 0 && len(e.EgressDomains) == 0:
		return "nothing beyond its node"
	case len(e.Egress) > 0 || len(e.EgressDomains) > 0:
		parts = append(parts, "only "+strings.Join(append(slices.Clone(e.Egress), e.EgressDomains...), ", "))
	default:
		parts = append(parts, "what the pool allows")
	}
	if deny := slices.DeleteFunc(slices.Clone(e.EgressDeny), func(s string) bool { return s == "0.0.0.0/0" }); len(deny) > 0 {
		parts = append(parts, "but "+strings.Join(deny, ", "))
	}
	return fmt.Sprint(strings.Join(parts, " "))
}

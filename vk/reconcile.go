package vk

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/pool"
	"github.com/sandman-dev/sandman/runtime"
)

// Adopt takes over the sandboxes the node agents hold for pods of this
// virtual node, after a restart or when a standby takes the lead: pods whose UID matches a bound slot are
// recorded as placed there (and not placed again); slots whose pod no
// longer exists are released. Call it after the pool has synced and before
// virtual-kubelet's pod controller starts.
func (p *Provider) Adopt(ctx context.Context) error {
	pods, err := p.cfg.Client.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{
		FieldSelector: fields.OneTermEqualSelector("spec.nodeName", p.cfg.NodeName).String(),
	})
	if err != nil {
		return err
	}
	byUID := map[string]*corev1.Pod{}
	for i := range pods.Items {
		byUID[string(pods.Items[i].UID)] = &pods.Items[i]
	}
	// A standby made the provider long before it took over: the pods it
	// waits for count LostAfter from the takeover.
	p.mu.Lock()
	p.started = p.cfg.Now()
	p.mu.Unlock()
	adopted, released := 0, 0
	for _, b := range p.cfg.Pool.Slots() {
		uid := b.Slot.Pod.UID
		pod, ok := byUID[uid]
		live := b.Slot.State == runtime.StateBound || b.Slot.State == runtime.StateBinding || b.Slot.State == runtime.StatePaused
		if !ok || !live || pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
			if live {
				if err := p.cfg.Pool.ReleaseOn(ctx, b.Node, uid, 0); err != nil {
					p.log.Warn("release orphaned sandbox", "pod", podRefKey(b.Slot.Pod), "uid", uid, "node", b.Node, "err", err)
				}
				released++
			}
			continue
		}
		p.mu.Lock()
		p.adoptLocked(newSandbox(pod.DeepCopy(), pod.CreationTimestamp.Time), b)
		p.mu.Unlock()
		adopted++
	}
	p.log.Info("adopted running sandboxes", "adopted", adopted, "released", released)
	return nil
}

// adoptLocked records sb's pod as running in slot b (found there after a
// restart) and tells the pool.
func (p *Provider) adoptLocked(sb *sandbox, b pool.BoundSlot) {
	pod, uid := sb.pod, b.Slot.Pod.UID
	req, err := p.bindRequest(pod)
	if err != nil {
		req = runtime.BindRequest{Pod: runtime.PodRef{UID: uid, Namespace: pod.Namespace, Name: pod.Name}}
	}
	sb.req, sb.submitted, sb.awaiting = req, true, false
	// Which control key its daemons hold is not known: the re-key finds
	// out when there are previous keys.
	sb.controlKey = nil
	sb.idleTimeout, _ = idleTimeout(pod)
	sb.expiresAt, _ = expiresAt(pod)
	// What its firewall has: what the virtual node last wrote it had; a
	// change made while no provider ran is applied now.
	sb.egressApplied = podcontract.AppliedEgress(pod.Annotations)
	defer p.reconcileEgressLocked(string(pod.UID), sb)
	started := b.Slot.Since
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.State.Running != nil {
			started = cs.State.Running.StartedAt.Time
		}
	}
	sb.bound(b.Node, b.Slot, started)
	if b.Slot.Ready {
		sb.ready(b.Node, b.Slot, started)
	}
	p.byUID[uid] = sb
	p.byKey[podKey(pod.Namespace, pod.Name)] = uid
	p.armDeadlineLocked(uid, sb)
	p.armExpiryLocked(uid, sb)
	p.cfg.Pool.Adopt(pool.Request{Bind: req, Job: jobOf(pod)}, b.Node)
	if _, ok := pod.Annotations[podcontract.AnnotationMoved]; ok {
		// Restored, by a virtual node that ended before it said so.
		p.owned.Go(func() { p.recordMoved(pod, nil) })
	}
}

// settleAwaiting adopts pods that ran before this provider started once
// the node agent holding them answers, and reports the others lost when
// every agent has answered without them or the pool's LostAfter has
// passed since the provider started.
func (p *Provider) settleAwaiting(now time.Time, slots []pool.BoundSlot) {
	p.mu.Lock()
	var adopted, lost []string
	var events []func()
	for _, b := range slots {
		sb := p.byUID[b.Slot.Pod.UID]
		if sb == nil || !sb.awaiting || b.Slot.State != runtime.StateBound && b.Slot.State != runtime.StatePaused {
			continue
		}
		p.adoptLocked(sb, b)
		adopted = append(adopted, b.Slot.Pod.UID)
	}
	unsynced := p.cfg.Pool.Unsynced()
	waited := now.Sub(p.started) >= p.cfg.Pool.LostAfter()
	for uid, sb := range p.byUID {
		if !sb.awaiting || (len(unsynced) > 0 && !waited) {
			continue
		}
		sb.awaiting = false
		msg := "the sandbox of this pod no longer exists on any node agent (it was lost while the virtual node was restarting)"
		reason := podcontract.ReasonSandboxLost
		if len(unsynced) > 0 {
			reason = podcontract.ReasonNodeLost
			msg = fmt.Sprintf("node agents %s have not answered since the virtual node started %v ago; the sandbox of this pod was on none of the others", strings.Join(unsynced, ", "), now.Sub(p.started).Round(time.Second))
		}
		sb.fail(reason, msg, now)
		pod := sb.pod
		lost = append(lost, uid)
		events = append(events, func() { p.cfg.Recorder.Event(pod, corev1.EventTypeWarning, reason, msg) })
	}
	p.mu.Unlock()
	for _, ev := range events {
		ev()
	}
	for _, uid := range append(adopted, lost...) {
		p.push(uid)
	}
	if len(adopted) > 0 {
		p.log.Info("adopted sandboxes of a node agent that answered late", "adopted", len(adopted))
	}
}

// Run reconciles slots and pods, re-keys sandboxes when the control keys
// change (rekey.go) and samples their resource use (usage.go), until ctx
// ends.
func (p *Provider) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { p.runRekey(ctx) })
	wg.Go(func() { p.runUsage(ctx) })
	t := p.cfg.NewTicker(p.cfg.ReconcileInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			p.reconcile(ctx)
		}
	}
}

// reconcile compares UIDs both ways: slots whose pod is gone are released
// after OrphanGrace; pods the provider holds that are gone from the API are
// released; pods that could not be queued are submitted again.
func (p *Provider) reconcile(ctx context.Context) {
	now := p.cfg.Now()
	// Slots whose pod the provider does not hold (or holds elsewhere).
	seen := map[string]bool{}
	var release []pool.BoundSlot
	slots := p.cfg.Pool.Slots()
	p.settleAwaiting(now, slots)
	p.movePaused(now)
	p.mu.Lock()
	for _, b := range slots {
		if b.Slot.State != runtime.StateBound && b.Slot.State != runtime.StateBinding && b.Slot.State != runtime.StatePaused {
			continue
		}
		uid := b.Slot.Pod.UID
		sb := p.byUID[uid]
		if sb != nil && !sb.terminal() && (sb.node == b.Node || sb.node == "") {
			continue
		}
		key := b.Node + "/" + uid
		seen[key] = true
		first, ok := p.orphans[key]
		if !ok {
			p.orphans[key] = now
			continue
		}
		if now.Sub(first) >= p.cfg.OrphanGrace {
			release = append(release, b)
			delete(p.orphans, key)
		}
	}
	for key := range p.orphans {
		if !seen[key] {
			delete(p.orphans, key)
		}
	}
	// Pods gone from the API without DeletePod (forced deletions).
	var gone, resubmit, expired, lapsed []string
	var overwritten []*corev1.Pod
	goneKeys := map[string]string{} // uid → namespace/name, for logs
	for uid, sb := range p.byUID {
		if d := deadlineOf(sb.pod, sb.created); !d.IsZero() && !now.Before(d) && !sb.terminal() {
			expired = append(expired, uid)
		}
		if !sb.expiresAt.IsZero() && !now.Before(sb.expiresAt) && !sb.deleting {
			lapsed = append(lapsed, uid)
		}
		if p.cfg.Pods != nil {
			pod, err := p.cfg.Pods.Pods(sb.pod.Namespace).Get(sb.pod.Name)
			if (apierrors.IsNotFound(err) || err == nil && string(pod.UID) != uid) && now.Sub(sb.created) >= p.cfg.OrphanGrace {
				gone = append(gone, uid)
				goneKeys[uid] = podKey(sb.pod.Namespace, sb.pod.Name)
				continue
			}
			if err == nil && string(pod.UID) == uid && sb.readyOverwritten(pod, now) {
				// The pod as the API has it with the sandbox's status: a
				// status write replaces labels and annotations too
				// (statuswrite.go).
				overwritten = append(overwritten, withStatus(pod, sb.podWithStatus(p.cfg.NodeIP)))
			}
		}
		// A sandbox that moved while paused is submitted by its resume.
		waitsResume := sb.offNode && sb.pauseOp == ""
		if !sb.submitted && !sb.awaiting && !sb.terminal() && !sb.deleting && !waitsResume && sb.pullFailures == 0 && sb.failures == 0 {
			resubmit = append(resubmit, uid)
		}
	}
	p.mu.Unlock()
	for _, b := range release {
		key := podRefKey(b.Slot.Pod)
		p.log.Info("releasing a sandbox whose pod is gone", "pod", key, "uid", b.Slot.Pod.UID, "node", b.Node, "slot", b.Slot.ID)
		if err := p.cfg.Pool.ReleaseOn(ctx, b.Node, b.Slot.Pod.UID, 0); err != nil {
			p.log.Warn("release orphan", "pod", key, "uid", b.Slot.Pod.UID, "node", b.Node, "err", err)
		}
		metricReleases.WithLabelValues("orphan").Inc()
	}
	for _, uid := range gone {
		p.log.Info("releasing a sandbox whose pod was deleted", "pod", goneKeys[uid], "uid", uid)
		if err := p.cfg.Pool.Release(ctx, uid, 0); err == nil {
			p.forget(uid)
			metricReleases.WithLabelValues("orphan").Inc()
		}
	}
	for _, pod := range overwritten {
		p.restoreStatus(ctx, pod)
	}
	for _, uid := range resubmit {
		p.submit(uid)
	}
	for _, uid := range expired {
		p.expire(uid)
	}
	for _, uid := range lapsed {
		p.reclaimExpired(ctx, uid)
	}
	p.checkIdle(ctx)
}

// statusRestoreGrace is how long a sandbox has been Ready before a pod
// status that says otherwise is taken for someone else's write rather than
// ours still on its way.
const statusRestoreGrace = 5 * time.Second

// readyOverwritten says the API has the pod not Ready though the sandbox
// has been Ready for a while: kube-controller-manager marks every pod of a
// node NotReady when it takes the node for unreachable (after an apiserver
// outage longer than its grace period, say), and only the node's kubelet
// ever sets them Ready again.
func (s *sandbox) readyOverwritten(pod *corev1.Pod, now time.Time) bool {
	if s.awaiting || s.terminal() || !s.isReady || now.Sub(s.readyAt) < statusRestoreGrace || pod.DeletionTimestamp != nil {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status != corev1.ConditionTrue
		}
	}
	return true
}

// restoreStatus writes the status a sandbox has over one someone else
// wrote. virtual-kubelet's status queue cannot: it drops a status equal to
// the last one it was given, whatever the API holds. A conflict (the pod
// changed meanwhile) waits for the next round.
func (p *Provider) restoreStatus(ctx context.Context, pod *corev1.Pod) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := p.cfg.Client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	if err != nil {
		p.log.Info("restore a pod status someone else changed", "pod", podKey(pod.Namespace, pod.Name), "err", err)
		return
	}
	metricStatusUpdates.Inc()
	p.log.Info("restored the status of a pod someone else had marked not ready", "pod", podKey(pod.Namespace, pod.Name))
}

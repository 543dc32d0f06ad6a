package vk

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	daemonapi "github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/podcontract"
)

// deadlineOf is when a pod's spec.activeDeadlineSeconds runs out, counted
// from its start as a kubelet does; zero when it has none.
func deadlineOf(pod *corev1.Pod, created time.Time) time.Time {
	ads := pod.Spec.ActiveDeadlineSeconds
	if ads == nil {
		return time.Time{}
	}
	start := created
	if !pod.CreationTimestamp.IsZero() {
		start = pod.CreationTimestamp.Time
	}
	return start.Add(time.Duration(*ads) * time.Second)
}

// armDeadlineLocked schedules the pod's deadline, if it has one. The
// reconciler checks deadlines too, so a timer lost to a restart is not a
// missed one.
func (p *Provider) armDeadlineLocked(uid string, sb *sandbox) {
	d := deadlineOf(sb.pod, sb.created)
	if d.IsZero() {
		return
	}
	stopTimer(sb.deadline)
	sb.deadline = p.afterFuncLocked(max(0, d.Sub(p.cfg.Now())), func() { p.expire(uid) })
}

// expire fails a pod past its deadline and releases its sandbox (or takes
// it out of the admission queue), recording why.
func (p *Provider) expire(uid string) {
	p.mu.Lock()
	sb := p.byUID[uid]
	if sb == nil || sb.terminal() || sb.deleting {
		p.mu.Unlock()
		return
	}
	d := deadlineOf(sb.pod, sb.created)
	if d.IsZero() || p.cfg.Now().Before(d) {
		p.mu.Unlock()
		return
	}
	msg := fmt.Sprintf("Pod was active on the node longer than the specified deadline (%ds)", *sb.pod.Spec.ActiveDeadlineSeconds)
	sb.fail(podcontract.ReasonDeadlineExceeded, msg, p.cfg.Now())
	pod, node := sb.pod, sb.node
	grace := 30 * time.Second
	if g := pod.Spec.TerminationGracePeriodSeconds; g != nil {
		grace = time.Duration(*g) * time.Second
	}
	p.mu.Unlock()
	key := podKey(pod.Namespace, pod.Name)
	p.log.Info("deadline exceeded", "pod", key)
	p.cfg.Recorder.Event(pod, corev1.EventTypeWarning, podcontract.ReasonDeadlineExceeded, msg)
	metricReclaims.WithLabelValues(podcontract.ReasonDeadlineExceeded, node).Inc()
	p.push(uid)
	p.owned.Go(func() { p.release(key, uid, grace, false) })
}

// expiresAt parses a pod's expiry; zero when it has none.
func expiresAt(pod *corev1.Pod) (time.Time, error) {
	v := pod.Annotations[podcontract.AnnotationExpiresAt]
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("annotation %s: %q is not an RFC 3339 time such as 2026-11-30T18:00:00Z", podcontract.AnnotationExpiresAt, v)
	}
	return t, nil
}

// armExpiryLocked schedules the reclaim of a sandbox at its expiry, moving
// it when the annotation changed. The reconciler checks expiries too.
func (p *Provider) armExpiryLocked(uid string, sb *sandbox) {
	stopTimer(sb.expiry)
	sb.expiry = nil
	if sb.expiresAt.IsZero() {
		return
	}
	sb.expiry = p.afterFuncLocked(max(0, sb.expiresAt.Sub(p.cfg.Now())), func() { p.reclaimExpired(context.Background(), uid) })
}

// reclaimExpired deletes the pod of a sandbox past its expiry and says
// why, or pauses it instead when the pod asks for that
// (podcontract.AnnotationOnExpiry; expiry.go).
func (p *Provider) reclaimExpired(ctx context.Context, uid string) {
	p.mu.Lock()
	sb := p.byUID[uid]
	if sb == nil || sb.deleting || sb.expiresAt.IsZero() || p.cfg.Now().Before(sb.expiresAt) {
		p.mu.Unlock()
		return
	}
	pod, at := sb.pod, sb.expiresAt
	action := p.expiryActionLocked(sb)
	if action == expiryPause {
		sb.pausingAtExpiry = at
	}
	p.mu.Unlock()
	switch action {
	case expiryWait:
		return
	case expiryPause:
		p.pauseAtExpiry(ctx, uid, pod, at)
		return
	}
	msg := fmt.Sprintf("the sandbox expired at %s (annotation %s): it was reclaimed", at.UTC().Format(time.RFC3339), podcontract.AnnotationExpiresAt)
	if v := pod.Annotations[podcontract.AnnotationPausedAtExpiry]; v != "" && wantPaused(pod) {
		msg = fmt.Sprintf("the sandbox, paused at its expiry (%s), was kept paused until %s (annotation %s): it was reclaimed", v, at.UTC().Format(time.RFC3339), podcontract.AnnotationExpiresAt)
	}
	p.deleteReclaimed(ctx, pod, msg)
}

// deleteReclaimed deletes the pod of a sandbox past its expiry, with an
// event that says why.
func (p *Provider) deleteReclaimed(ctx context.Context, pod *corev1.Pod, msg string) {
	p.log.Info("expired", "pod", podKey(pod.Namespace, pod.Name), "why", msg)
	p.cfg.Recorder.Event(pod, corev1.EventTypeNormal, podcontract.ReasonExpired, msg)
	metricReclaims.WithLabelValues(podcontract.ReasonExpired, p.nodeOf(pod.UID)).Inc()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	puid := pod.UID
	err := p.cfg.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
		GracePeriodSeconds: new(int64), Preconditions: &metav1.Preconditions{UID: &puid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		p.log.Warn("delete expired pod", "pod", podKey(pod.Namespace, pod.Name), "err", err)
	}
}

// idleTimeout parses a pod's idle timeout; zero when it has none.
func idleTimeout(pod *corev1.Pod) (time.Duration, error) {
	v := pod.Annotations[podcontract.AnnotationIdleTimeout]
	if v == "" {
		return 0, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("annotation %s: %q is not a positive duration such as 30m", podcontract.AnnotationIdleTimeout, v)
	}
	return d, nil
}

// checkIdle asks the daemons of ready sandboxes with an idle timeout, whose
// next check is due, how long they have been idle, and deletes the pods
// idle past their timeout. A sandbox is asked again no sooner than it could
// expire, so a busy pool costs about one health call per sandbox and
// timeout.
func (p *Provider) checkIdle(ctx context.Context) {
	now := p.cfg.Now()
	type due struct {
		uid, ip string
		pod     *corev1.Pod
		timeout time.Duration
		key     []byte
	}
	var list []due
	var pausedIdle []due
	p.mu.Lock()
	for uid, sb := range p.byUID {
		// A paused sandbox has been idle at least since its pause.
		if sb.paused && sb.pauseOp == "" && !sb.terminal() && !sb.deleting && sb.idleTimeout > 0 && now.Sub(sb.pauseSince) >= sb.idleTimeout {
			pausedIdle = append(pausedIdle, due{uid: uid, pod: sb.pod, timeout: now.Sub(sb.pauseSince)})
			continue
		}
		timeout := sb.idleTimeout
		if p.autoPauses(sb) && (timeout <= 0 || p.cfg.AutoPauseAfter < timeout) {
			timeout = p.cfg.AutoPauseAfter
		}
		if !sb.isReady || sb.terminal() || sb.deleting || timeout <= 0 || now.Before(sb.nextIdleCheck) {
			continue
		}
		list = append(list, due{uid: uid, ip: sb.slot.IP, pod: sb.pod, timeout: timeout, key: sb.controlKey})
	}
	p.mu.Unlock()
	for _, d := range pausedIdle {
		p.reclaimIdle(ctx, d.pod, d.timeout)
	}
	sem := make(chan struct{}, 64)
	var wg sync.WaitGroup
	for _, d := range list {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			h, ok := p.idleHealth(ctx, d.ip+":"+strconv.Itoa(daemonapi.Port), d.uid, d.key)
			if !ok {
				return // unreachable now, or no key taken: asked again next round
			}
			idle := time.Duration(h.IdleSeconds * float64(time.Second))
			// Auto-pause waits for no call, whatever runs (the processes
			// go on after the resume).
			callIdle := time.Duration(h.CallIdleSeconds * float64(time.Second))
			p.mu.Lock()
			sb := p.byUID[d.uid]
			reclaim := sb != nil && sb.idleTimeout > 0 && idle >= sb.idleTimeout
			pauses := sb != nil && !reclaim && p.autoPauses(sb) && !wantPaused(sb.pod)
			pause := pauses && callIdle >= p.cfg.AutoPauseAfter
			if sb != nil && !reclaim && !pause {
				next := time.Duration(1 << 62)
				if sb.idleTimeout > 0 {
					next = sb.idleTimeout - idle
				}
				if pauses {
					next = min(next, p.cfg.AutoPauseAfter-callIdle)
				}
				sb.nextIdleCheck = now.Add(max(time.Second, next))
			}
			p.mu.Unlock()
			switch {
			case reclaim:
				p.reclaimIdle(ctx, d.pod, idle)
			case pause:
				p.autoPause(ctx, d.pod, callIdle)
			}
		}()
	}
	wg.Wait()
}

// idleHealth asks a daemon's health with the control plane's token, trying
// each control key: without a token it takes, health tells nothing but
// "up" (no version, no idle time). False when the daemon did not answer or
// took no key.
func (p *Provider) idleHealth(ctx context.Context, addr, uid string, known []byte) (daemonapi.Health, bool) {
	var clients []*client.Client
	var err error
	if p.cfg.ControlKeys != nil {
		clients, err = p.daemonClients(addr, uid, known, 0)
	} else {
		// An unauthenticated sandbox (the only kind with an idle timeout
		// then) tells everything without a token.
		var c *client.Client
		c, err = client.New(addr, client.WithRetries(0), client.WithHTTPClient(p.daemonHTTP))
		clients = []*client.Client{c}
	}
	if err != nil {
		return daemonapi.Health{}, false
	}
	for _, c := range clients {
		hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		h, err := c.Health(hctx)
		cancel()
		if err != nil {
			return h, false
		}
		if h.Version != "" {
			return h, true
		}
	}
	return daemonapi.Health{}, false
}

// reclaimIdle deletes an idle sandbox's pod and says why.
func (p *Provider) reclaimIdle(ctx context.Context, pod *corev1.Pod, idle time.Duration) {
	msg := fmt.Sprintf("no daemon call and nothing running for %s (annotation %s=%s): the sandbox was reclaimed",
		idle.Round(time.Second), podcontract.AnnotationIdleTimeout, pod.Annotations[podcontract.AnnotationIdleTimeout])
	p.log.Info("idle timeout", "pod", podKey(pod.Namespace, pod.Name), "idle", idle)
	p.cfg.Recorder.Event(pod, corev1.EventTypeWarning, podcontract.ReasonIdleTimeout, msg)
	metricReclaims.WithLabelValues(podcontract.ReasonIdleTimeout, p.nodeOf(pod.UID)).Inc()
	uid := pod.UID
	err := p.cfg.Client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		p.log.Warn("delete idle pod", "pod", podKey(pod.Namespace, pod.Name), "err", err)
	}
}

// nodeOf is the worker node a pod's sandbox was placed on ("" if none).
func (p *Provider) nodeOf(uid types.UID) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if sb := p.byUID[string(uid)]; sb != nil {
		return sb.node
	}
	return ""
}

// autoPauses says whether the sandbox is one AutoPauseAfter pauses: a
// gVisor pod of one container, with the control plane's token to ask it.
func (p *Provider) autoPauses(sb *sandbox) bool {
	return p.cfg.AutoPauseAfter > 0 && sb.req.GVisor() && len(sb.req.Containers) == 1 && !sb.paused && sb.pauseOp == "" && !sb.pauseRefused
}

// pullSecretWait bounds how long a new pod waits for its image pull
// Secrets to reach the provider's informer.
const pullSecretWait = 5 * time.Second

// awaitPullSecrets waits until the informer holds the pod's image pull
// Secrets that exist: one made just before the pod (sandman-gateway's for
// a build from a private image) may not have reached it yet, and a pull
// without it would be refused. A Secret the API does not have either is
// not waited for (bindRequest goes on without it, as a kubelet would).
func (p *Provider) awaitPullSecrets(ctx context.Context, pod *corev1.Pod) {
	if p.cfg.Secrets == nil {
		return
	}
	for _, ref := range pod.Spec.ImagePullSecrets {
		if _, err := p.cfg.Secrets.Secrets(pod.Namespace).Get(ref.Name); !apierrors.IsNotFound(err) {
			continue
		}
		gctx, cancel := context.WithTimeout(ctx, pullSecretWait)
		_, err := p.cfg.Client.CoreV1().Secrets(pod.Namespace).Get(gctx, ref.Name, metav1.GetOptions{})
		for err == nil {
			if _, lerr := p.cfg.Secrets.Secrets(pod.Namespace).Get(ref.Name); lerr == nil {
				break
			}
			select {
			case <-gctx.Done():
				err = gctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
		cancel()
	}
}

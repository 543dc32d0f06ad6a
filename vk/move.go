package vk

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/pool"
	"github.com/sandman-dev/sandman/runtime"
)

// Moves: a drain of a worker whose node agent has a checkpoint repository
// moves its gVisor sandboxes instead of evicting them (pool.Moved). A
// running one is submitted again at once with its checkpoint
// (BindRequest.Restore) and goes on on another node: the pod says Moving,
// then Moved, and gets a new address. A paused one stays paused, held by
// no node (offNode): it takes no slot anywhere, and its resume is that
// bind, which waits in the pool's queue like any other. A pod deleted
// before its checkpoint was restored has the checkpoint deleted.

// movedLocked records a Moved update, and has it written into the pod
// (recordMoved). The caller holds mu.
func (p *Provider) movedLocked(sb *sandbox, u pool.Update) {
	m := *u.Moved
	pod := sb.pod
	p.owned.Go(func() { p.recordMoved(pod, &m) })
	p.offNodeLocked(sb, m, u.Message)
}

// offNodeLocked records that sb's sandbox is held by no node, its state in
// checkpoint m. The caller holds mu.
func (p *Provider) offNodeLocked(sb *sandbox, m runtime.MovedCheckpoint, message string) {
	sb.req.Restore, sb.req.Fork = &m, nil
	sb.node, sb.slot, sb.isReady = "", runtime.Slot{}, false
	sb.moves++
	sb.submitted = false
	if m.Paused {
		sb.offNode = true
		sb.pauseMessage = fmt.Sprintf("paused; its worker %s was drained, so its running state (%.1f MiB) waits in the pool's checkpoint repository: a resume restores it on any worker", m.From, float64(m.Bytes)/(1<<20))
		return
	}
	sb.moving, sb.message = true, message
}

// recordMoved writes m into the pod (podcontract.AnnotationMoved), or
// removes it when m is nil: a virtual node that starts while no node holds
// the sandbox restores it from there. The patch names the pod's UID.
func (p *Provider) recordMoved(pod *corev1.Pod, m *runtime.MovedCheckpoint) {
	var value any
	if m != nil {
		b, _ := json.Marshal(m)
		value = string(b)
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid": pod.UID, "annotations": map[string]any{podcontract.AnnotationMoved: value},
	}})
	ctx, cancel := context.WithTimeout(p.ctx, time.Minute)
	defer cancel()
	_, err := p.cfg.Client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		p.log.Warn("record a moved sandbox's checkpoint in its pod", "pod", podKey(pod.Namespace, pod.Name), "err", err)
	}
}

// restoreMovedLocked takes up a pod that a virtual node before this one
// saw move (its AnnotationMoved) and that no node holds: paused, it stays
// so, off any node; running, it is restored (the caller submits it). The
// caller holds mu.
func (p *Provider) restoreMovedLocked(sb *sandbox, m runtime.MovedCheckpoint) {
	sb.startedAt = p.cfg.Now()
	for _, cs := range sb.pod.Status.ContainerStatuses {
		if r := cs.State.Running; r != nil && !r.StartedAt.IsZero() {
			sb.startedAt = r.StartedAt.Time
		}
	}
	if m.Paused {
		sb.paused, sb.pauseSince = true, p.cfg.Now()
	}
	p.offNodeLocked(sb, m, fmt.Sprintf("moved off node %s: its running state (%.1f MiB) waits in %s", m.From, float64(m.Bytes)/(1<<20), m.Ref))
}

// movePaused moves the sandboxes paused longer than MovePausedAfter off
// their nodes (each reconcile), once per pause: they then hold no slot.
// A node that cannot (no checkpoint repository) leaves them where they
// are.
func (p *Provider) movePaused(now time.Time) {
	if p.cfg.MovePausedAfter <= 0 {
		return
	}
	var uids []string
	p.mu.Lock()
	for uid, sb := range p.byUID {
		if sb.paused && !sb.offNode && !sb.moveAsked && sb.pauseOp == "" && !sb.terminal() && !sb.deleting &&
			sb.slot.ID != "" && now.Sub(sb.pauseSince) >= p.cfg.MovePausedAfter {
			sb.moveAsked = true
			uids = append(uids, uid)
		}
	}
	p.mu.Unlock()
	for _, uid := range uids {
		p.owned.Go(func() {
			ctx, cancel := context.WithTimeout(p.ctx, pauseTimeout)
			defer cancel()
			if _, err := p.cfg.Pool.Move(ctx, uid); err != nil {
				p.log.Info("a long-paused sandbox stays on its node", "uid", uid, "err", err)
			}
		})
	}
}

// movedFrom reads a pod's AnnotationMoved (false: none, or unreadable).
// The pod's tenant can write it too: a checkpoint this pool would not
// have pushed for this very pod (runtime.CheckMovedRef: another
// namespace's or pod's) is refused, and the error says so.
func movedFrom(pod *corev1.Pod) (runtime.MovedCheckpoint, bool, error) {
	v, ok := pod.Annotations[podcontract.AnnotationMoved]
	if !ok {
		return runtime.MovedCheckpoint{}, false, nil
	}
	var m runtime.MovedCheckpoint
	if json.Unmarshal([]byte(v), &m) != nil || m.Ref == "" {
		return runtime.MovedCheckpoint{}, false, nil
	}
	if err := runtime.CheckMovedRef(m.Ref, runtime.PodRef{UID: string(pod.UID), Namespace: pod.Namespace, Name: pod.Name}); err != nil {
		return runtime.MovedCheckpoint{}, false, fmt.Errorf("annotation %s refused: %w", podcontract.AnnotationMoved, err)
	}
	return m, true, nil
}

// resumeMoved resumes a sandbox that moved while paused: its checkpoint is
// bound like a new pod's image (the pool's queue, any node) and the call
// waits until it is Ready, the pod ends, or ctx does.
func (p *Provider) resumeMoved(ctx context.Context, uid string) (node string, err error) {
	p.submit(uid)
	for {
		p.mu.Lock()
		sb := p.byUID[uid]
		switch {
		case sb == nil || sb.deleting:
			p.mu.Unlock()
			return "", fmt.Errorf("the pod was deleted while it was resumed: %w", context.Canceled)
		case sb.failed:
			msg := sb.message
			p.mu.Unlock()
			return "", fmt.Errorf("%s: %w", msg, errdefs.ErrDataLoss)
		case sb.isReady && sb.slot.ID != "":
			sb.offNode = false
			node := sb.node
			p.mu.Unlock()
			return node, nil
		}
		p.mu.Unlock()
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("not restored yet: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// dropMoved deletes the checkpoint of a released pod that never ran
// again from it (deleted while moving, or while paused off any node).
func (p *Provider) dropMoved(uid string) {
	p.mu.Lock()
	sb := p.byUID[uid]
	var ref string
	var pod runtime.PodRef
	if sb != nil && sb.req.Restore != nil {
		ref, pod = sb.req.Restore.Ref, sb.req.Pod
		sb.req.Restore = nil
	}
	p.mu.Unlock()
	if ref == "" {
		return
	}
	ctx, cancel := context.WithTimeout(p.ctx, time.Minute)
	defer cancel()
	// The pool deletes only the pod's own checkpoint.
	key := podKey(pod.Namespace, pod.Name)
	if err := p.cfg.Pool.DeleteCheckpoint(ctx, pod, ref); err != nil {
		p.log.Warn("delete a moved sandbox's checkpoint", "pod", key, "uid", uid, "ref", ref, "err", err)
		return
	}
	p.log.Info("deleted a moved sandbox's checkpoint", "pod", key, "uid", uid, "ref", ref)
}

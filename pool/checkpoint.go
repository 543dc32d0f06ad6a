package pool

import (
	"context"
	"errors"
	"fmt"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime"
)

// Pause checkpoints a bound pod's sandbox to its node's disk
// (runtime.Checkpointer) and Resume restores it there. The pod stays
// placed on its node while paused; its slot's requests stop counting
// against the node once the agent reports the slot paused. Errors are
// Snapshot's for a pod the pool does not hold or whose node cannot be
// reached, ErrNotImplemented for a node agent that cannot pause, and the
// node agent's own (runtime.Checkpointer) keep their errdefs class.
func (p *Pool) Pause(ctx context.Context, uid string) (runtime.PauseResult, error) {
	n, ref, cp, err := p.checkpointer(uid)
	if err != nil {
		return runtime.PauseResult{}, err
	}
	start := p.cfg.Clock.Now()
	res, err := cp.Pause(ctx, uid)
	metricCheckpoints.WithLabelValues(n.name, "pause", runtime.SnapshotOutcome(err)).Inc()
	if err != nil {
		return runtime.PauseResult{}, fmt.Errorf("pause of pod %s on node %s: %w", ref, n.name, err)
	}
	p.log.Info("paused", "pod", ref, "uid", uid, "node", n.name, "bytes", res.Bytes, "took", p.cfg.Clock.Since(start))
	p.nudge() // its requests are free for queued pods
	return res, nil
}

// Resume: see Pause.
func (p *Pool) Resume(ctx context.Context, uid string) error {
	n, ref, cp, err := p.checkpointer(uid)
	if err != nil {
		return err
	}
	start := p.cfg.Clock.Now()
	err = cp.Resume(ctx, uid)
	metricCheckpoints.WithLabelValues(n.name, "resume", runtime.SnapshotOutcome(err)).Inc()
	if err != nil {
		return fmt.Errorf("resume of pod %s on node %s: %w", ref, n.name, err)
	}
	p.log.Info("resumed", "pod", ref, "uid", uid, "node", n.name, "took", p.cfg.Clock.Since(start))
	return nil
}

// Move moves a placed pod's gVisor sandbox off its node
// (runtime.Mover): the node reports it Moved (an Update of kind Moved,
// which unplaces the pod) and releases its slot. Errors are Pause's, and
// ErrNotImplemented for a node agent that cannot move sandboxes.
func (p *Pool) Move(ctx context.Context, uid string) (runtime.MovedCheckpoint, error) {
	n, ref, err := p.snapshotNode(uid)
	if err != nil {
		return runtime.MovedCheckpoint{}, err
	}
	mv, ok := n.rt.(runtime.Mover)
	if !ok {
		return runtime.MovedCheckpoint{}, fmt.Errorf("pod %s: node agent %s cannot move sandboxes (is its sandman-node older than sandman-vk?): %w",
			ref, n.name, errdefs.ErrNotImplemented)
	}
	start := p.cfg.Clock.Now()
	moved, err := mv.Move(ctx, uid)
	metricCheckpoints.WithLabelValues(n.name, "move", runtime.SnapshotOutcome(err)).Inc()
	if err != nil {
		return runtime.MovedCheckpoint{}, fmt.Errorf("move of pod %s off node %s: %w", ref, n.name, err)
	}
	p.log.Info("moved", "pod", ref, "uid", uid, "node", n.name, "ref", moved.Ref, "bytes", moved.Bytes, "took", p.cfg.Clock.Since(start))
	p.nudge()
	return moved, nil
}

func (p *Pool) checkpointer(uid string) (*node, string, runtime.Checkpointer, error) {
	n, ref, err := p.snapshotNode(uid)
	if err != nil {
		return nil, "", nil, err
	}
	cp, ok := n.rt.(runtime.Checkpointer)
	if !ok {
		return nil, "", nil, fmt.Errorf("pod %s: node agent %s cannot pause sandboxes (is its sandman-node older than sandman-vk?): %w",
			ref, n.name, errdefs.ErrNotImplemented)
	}
	return n, ref, cp, nil
}

// DeleteCheckpoint deletes pod's moved sandbox's artifact (a pod deleted
// before it was restored) through the first healthy node agent that can
// (runtime.CheckpointStore): they share the pool's checkpoint repository.
// A ref that is not pod's (runtime.CheckMovedRef; the node agent checks
// the UID in the artifact too) is ErrInvalidArgument, and nothing is
// deleted.
func (p *Pool) DeleteCheckpoint(ctx context.Context, pod runtime.PodRef, ref string) error {
	if err := runtime.CheckMovedRef(ref, pod); err != nil {
		return fmt.Errorf("delete checkpoint for pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	p.mu.Lock()
	var stores []runtime.CheckpointStore
	for _, n := range p.sortedNodesLocked() {
		if cs, ok := n.rt.(runtime.CheckpointStore); ok && n.healthy {
			stores = append(stores, cs)
		}
	}
	p.mu.Unlock()
	if len(stores) == 0 {
		return fmt.Errorf("delete checkpoint %s: no node agent of pool %s can reach the checkpoint repository now: %w", ref, p.cfg.Name, errdefs.ErrUnavailable)
	}
	var errs []error
	for _, cs := range stores {
		err := cs.DeleteCheckpoint(ctx, pod, ref)
		if err == nil || errdefs.IsInvalidArgument(err) {
			return err
		}
		errs = append(errs, err)
	}
	return fmt.Errorf("delete checkpoint %s: %w", ref, errors.Join(errs...))
}

package pool

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime"
)

// SnapshotQueued is the progress phase Snapshot reports, before any of the
// node agent's phases, when the pod's node already takes SnapshotsPerNode
// snapshots: this one waits for its turn.
const SnapshotQueued runtime.SnapshotPhase = "queued"

// Snapshot commits the filesystem changes of a bound pod's container as a
// new image (runtime.Snapshotter) on the node agent the pod is bound on.
//
// The pod must be bound: a pod the pool does not hold fails with
// ErrNotFound, one that waits for a slot or is still binding with
// ErrFailedPrecondition, one whose node agent is unreachable with
// ErrUnavailable, and a node agent that takes no snapshots with
// ErrNotImplemented. The image made counts as on that node for placement
// (by tag and by digest), so forks prefer it. At most SnapshotsPerNode
// snapshots run on a node at once; another waits its turn (reported once as
// SnapshotQueued) until ctx ends. The node agent's own errors keep their
// errdefs class.
func (p *Pool) Snapshot(ctx context.Context, req runtime.SnapshotRequest, progress func(runtime.SnapshotProgress)) (runtime.SnapshotResult, error) {
	n, ref, err := p.snapshotNode(req.PodUID)
	if err != nil {
		return runtime.SnapshotResult{}, err
	}
	sn, ok := n.rt.(runtime.Snapshotter)
	if !ok {
		return runtime.SnapshotResult{}, fmt.Errorf("snapshot of pod %s: node agent %s takes no snapshots (is its sandman-node older than sandman-vk?): %w",
			ref, n.name, errdefs.ErrNotImplemented)
	}
	select {
	case n.snapshots <- struct{}{}:
	default:
		if progress != nil {
			progress(runtime.SnapshotProgress{Phase: SnapshotQueued})
		}
		select {
		case n.snapshots <- struct{}{}:
		case <-ctx.Done():
			return runtime.SnapshotResult{}, fmt.Errorf("snapshot of pod %s: waiting for one of node %s's %d snapshots to end: %w",
				ref, n.name, cap(n.snapshots), ctx.Err())
		}
	}
	defer func() { <-n.snapshots }()
	start := p.cfg.Clock.Now()
	res, err := sn.Snapshot(ctx, req, progress)
	outcome := runtime.SnapshotOutcome(err)
	metricSnapshots.WithLabelValues(n.name, outcome).Inc()
	metricSnapshotSeconds.WithLabelValues(outcome).Observe(p.cfg.Clock.Since(start).Seconds())
	if err != nil {
		return runtime.SnapshotResult{}, fmt.Errorf("snapshot of pod %s on node %s: %w", ref, n.name, err)
	}
	metricSnapshotFrozenSeconds.Observe(res.Frozen.Seconds())
	// Forks of the image prefer this node, which holds it.
	p.mu.Lock()
	n.snapshotted[imageKey(res.Image)] = true
	if res.Digest != "" {
		n.snapshotted[imageKey(res.Image+"@"+res.Digest)] = true
	}
	p.mu.Unlock()
	p.nudge()
	p.log.Info("snapshot", "pod", ref, "uid", req.PodUID, "node", n.name, "image", res.Image, "digest", res.Digest,
		"diff_bytes", res.DiffBytes, "frozen", res.Frozen, "took", res.Duration)
	return res, nil
}

// snapshotNode is the node a pod is bound on, and the pod as namespace/name.
func (p *Pool) snapshotNode(uid string) (*node, string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if req, ok := p.queue.get(uid); ok {
		return nil, "", fmt.Errorf("pod %s is not bound to a slot yet (WaitingForSlot): %w", podRefKey(req.Bind.Pod), errdefs.ErrFailedPrecondition)
	}
	pl, ok := p.placed[uid]
	if !ok {
		return nil, "", fmt.Errorf("pod %s is neither queued nor placed in pool %s: %w", uid, p.cfg.Name, errdefs.ErrNotFound)
	}
	ref := podRefKey(pl.req.Bind.Pod)
	n := p.nodes[pl.node]
	switch {
	case pl.binding:
		return nil, "", fmt.Errorf("pod %s is not bound to a slot yet (binding on node %s): %w", ref, pl.node, errdefs.ErrFailedPrecondition)
	case n == nil:
		return nil, "", fmt.Errorf("snapshot of pod %s: node agent %s is gone from pool %s: %w", ref, pl.node, p.cfg.Name, errdefs.ErrUnavailable)
	case !n.healthy:
		why := "no answer yet"
		if n.err != nil {
			why = n.err.Error()
		}
		return nil, "", fmt.Errorf("snapshot of pod %s: node agent %s is unreachable (%s): %w", ref, pl.node, why, errdefs.ErrUnavailable)
	}
	return n, ref, nil
}

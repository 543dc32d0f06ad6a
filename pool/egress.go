package pool

import (
	"context"
	"fmt"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime"
)

// SetEgress replaces what a pod's sandbox may reach (runtime.EgressSetter):
// a queued pod binds with e when its turn comes; a placed one has its
// node agent rewrite its firewall, and its request keeps e. A pod being
// bound is ErrFailedPrecondition (ask again once it is). Errors otherwise
// are Snapshot's for a pod the pool does not hold or whose node cannot be
// reached, ErrNotImplemented for a node agent that cannot, and the node
// agent's own.
func (p *Pool) SetEgress(ctx context.Context, uid string, e runtime.Egress) error {
	if err := e.Validate(); err != nil {
		return err
	}
	p.mu.Lock()
	if jq, i := p.queue.find(uid); jq != nil {
		b := &jq.pods[i].Bind
		b.Egress, b.EgressDeny, b.EgressDomains = e.Egress, e.EgressDeny, e.EgressDomains
		p.mu.Unlock()
		return nil
	}
	p.mu.Unlock()
	n, ref, err := p.snapshotNode(uid)
	if err != nil {
		return err
	}
	es, ok := n.rt.(runtime.EgressSetter)
	if !ok {
		return fmt.Errorf("pod %s: node agent %s cannot change a sandbox's egress (is its sandman-node older than sandman-vk?): %w", ref, n.name, errdefs.ErrNotImplemented)
	}
	if err := es.SetEgress(ctx, uid, e); err != nil {
		return fmt.Errorf("egress of pod %s on node %s: %w", ref, n.name, err)
	}
	p.mu.Lock()
	if pl, ok := p.placed[uid]; ok {
		b := &pl.req.Bind
		b.Egress, b.EgressDeny, b.EgressDomains = e.Egress, e.EgressDeny, e.EgressDomains
	}
	p.mu.Unlock()
	p.log.Info("egress changed", "pod", ref, "uid", uid, "node", n.name)
	return nil
}

package vk

import (
	"context"
	"fmt"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// poolOpen says whether every namespace may place pods on the pool.
func (c *Config) poolOpen() bool {
	return len(c.AllowedNamespaces) == 0 && c.AllowedNamespaceSelector == nil
}

// poolName is the pool's name for messages (the virtual node's when the
// provider has no pool, as in translation-only tests).
func (p *Provider) poolName() string {
	if p.cfg.Pool != nil {
		return p.cfg.Pool.Name()
	}
	return p.cfg.NodeName
}

// namespaceAccess says why pods of namespace ns may not be placed on the
// pool (a *notAllowedError), or nil when they may. The pool's rule holds
// however a pod reached the virtual node: its node selector and
// toleration, or a spec.nodeName set by hand, which skips the taint. A
// namespace the informer has not seen yet (just created) is read from the
// apiserver; an error reading it is returned as it is, so the pod's
// creation is retried rather than failed.
func (p *Provider) namespaceAccess(ctx context.Context, ns string) error {
	if p.cfg.poolOpen() || slices.Contains(p.cfg.AllowedNamespaces, ns) {
		return nil
	}
	if sel := p.cfg.AllowedNamespaceSelector; sel != nil {
		n, err := p.cfg.Namespaces.Get(ns)
		if apierrors.IsNotFound(err) {
			n, err = p.cfg.Client.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		}
		switch {
		case apierrors.IsNotFound(err):
			// Gone: nothing of it may run.
		case err != nil:
			return fmt.Errorf("read namespace %s for pool %s's access rule: %w", ns, p.poolName(), err)
		case sel.Matches(labels.Set(n.Labels)):
			return nil
		}
	}
	return &notAllowedError{ns: ns, pool: p.poolName(), node: p.cfg.NodeName, selector: p.cfg.AllowedNamespaceSelector}
}

// notAllowedError: a namespace the pool's access rule leaves out.
type notAllowedError struct {
	ns, pool, node string
	selector       labels.Selector
}

func (e *notAllowedError) Error() string {
	how := "adding it to sandman-vk's --allowed-namespaces"
	if e.selector != nil {
		how = fmt.Sprintf("labelling it to match %s (kubectl label namespace %s …) or %s", e.selector, e.ns, how)
	}
	return fmt.Sprintf("namespace %s may not place pods on pool %s (virtual node %s): ask the pool's operator to allow it, by %s",
		e.ns, e.pool, e.node, how)
}

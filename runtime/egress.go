package runtime

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/containerd/errdefs"
)

// Egress is what a sandbox may reach beyond its node: BindRequest's Egress,
// EgressDeny and EgressDomains, which the pod's egress annotations set.
type Egress struct {
	Egress        []string `json:"egress,omitempty"`
	EgressDeny    []string `json:"egress_deny,omitempty"`
	EgressDomains []string `json:"egress_domains,omitempty"`
}

// Validate checks e as BindRequest.Validate checks the same fields.
func (e Egress) Validate() error {
	for _, c := range e.Egress {
		if p, err := netip.ParsePrefix(c); err != nil || !p.Addr().Is4() {
			return fmt.Errorf("egress %q: want an IPv4 CIDR such as 203.0.113.0/24: %w", c, errdefs.ErrInvalidArgument)
		}
	}
	for _, c := range e.EgressDeny {
		if p, err := netip.ParsePrefix(c); err != nil || !p.Addr().Is4() {
			return fmt.Errorf("egress deny %q: want an IPv4 CIDR such as 203.0.113.0/24: %w", c, errdefs.ErrInvalidArgument)
		}
	}
	if err := CheckEgressDomains(e.EgressDomains); err != nil {
		return fmt.Errorf("egress domains: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	return nil
}

// EgressOf is the egress a bind request asks for.
func (r BindRequest) EgressOf() Egress {
	return Egress{Egress: r.Egress, EgressDeny: r.EgressDeny, EgressDomains: r.EgressDomains}
}

// EgressSetter is implemented by runtimes that can change a running
// sandbox's egress: runtime/noderuntime, runtime/fake and the node API
// client. SetEgress replaces what the bound (or paused) pod's sandbox may
// reach with e, as a bind with e would have written it: its firewall is
// rewritten whole, its names resolved anew (connections the new rules
// refuse end at their next packet). The pool's own rules still apply: e
// only narrows what the node allows. Errors use errdefs classes:
// ErrNotFound (the pod is not on this node), ErrFailedPrecondition (not
// bound, or binding or releasing), ErrInvalidArgument (e does not parse,
// or asks for internet egress a pool without it cannot give). A failed
// SetEgress leaves the previous egress in place.
type EgressSetter interface {
	SetEgress(ctx context.Context, podUID string, e Egress) error
}

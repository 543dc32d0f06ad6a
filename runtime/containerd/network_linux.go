package containerd

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/sandboxnet"
)

// nodeDeny is what no sandbox may reach: sandboxnet.SpecialRanges, the
// pool's EgressDeny and every address of this node.
func nodeDeny(extra []netip.Prefix) []netip.Prefix {
	deny := append(append([]netip.Prefix{}, sandboxnet.SpecialRanges...), extra...)
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok {
			continue
		}
		if ip, ok := netip.AddrFromSlice(n.IP.To4()); ok && n.IP.To4() != nil {
			deny = append(deny, netip.PrefixFrom(ip, 32))
		}
	}
	return deny
}

// policy is the firewall of a slot: the pool's egress, narrowed by the
// pod's; inbound, the daemons' ports and the pod's declared ports. With no
// pod (a warm or hot slot), only the first daemon's port is open.
func (r *Runtime) policy(req *runtime.BindRequest) (sandboxnet.Policy, error) {
	p := sandboxnet.Policy{Internet: r.cfg.EgressInternet, Allow: r.cfg.EgressAllow, Deny: r.deny,
		TCPPorts: []uint16{api.Port}}
	if req == nil {
		return p, nil
	}
	if len(req.Egress) > 0 {
		if !r.cfg.EgressInternet {
			return p, fmt.Errorf("bind %s: the pod narrows its egress (sandman.io/egress) but this pool allows sandboxes no internet egress at all: remove the annotation, or ask the operator for a pool with egress: %w",
				req.Pod.UID, errdefs.ErrInvalidArgument)
		}
		only, err := sandboxnet.ParsePrefixes(strings.Join(req.Egress, ","))
		if err != nil {
			return p, fmt.Errorf("bind %s: egress: %v: %w", req.Pod.UID, err, errdefs.ErrInvalidArgument)
		}
		p.Only = only
	}
	p.TCPPorts = nil
	for i, c := range req.Containers {
		p.TCPPorts = append(p.TCPPorts, uint16(api.Port+i))
		for _, port := range c.Ports {
			if port.Protocol == "UDP" {
				p.UDPPorts = append(p.UDPPorts, uint16(port.Port))
			} else {
				p.TCPPorts = append(p.TCPPorts, uint16(port.Port))
			}
		}
	}
	return p, nil
}

// firewall writes a slot's policy into its network namespace.
func (r *Runtime) firewall(nsPath string, req *runtime.BindRequest) error {
	if r.cfg.NoFirewall {
		return nil
	}
	p, err := r.policy(req)
	if err != nil {
		return err
	}
	t := time.Now()
	if err := sandboxnet.Apply(nsPath, p); err != nil {
		return errors.Join(err, errors.New("the node's kernel needs nf_tables (or run the agent with --no-sandbox-firewall, which lets sandboxes reach everything the node can)"))
	}
	r.metrics.observePhase("firewall", t)
	return nil
}

package noderuntime

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/vishvananda/netlink"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/sandboxnet"
)

// nodeAddrs are this node's IPv4 addresses, each a /32.
func nodeAddrs() []netip.Prefix {
	var out []netip.Prefix
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok || n.IP.To4() == nil {
			continue
		}
		if ip, ok := netip.AddrFromSlice(n.IP.To4()); ok {
			out = append(out, netip.PrefixFrom(ip, 32))
		}
	}
	return out
}

// policy is the firewall of a slot whose address is ip: the pool's
// egress, narrowed by the pod's (its egress list, its allowed names and
// its denied ranges); inbound, the daemons' ports and the pod's declared
// ports. With no pod (a warm or hot slot), only the first daemon's port
// is open.
func (r *Runtime) policy(req *runtime.BindRequest, ip string) (sandboxnet.Policy, error) {
	p := sandboxnet.Policy{Internet: r.cfg.EgressInternet, Allow: r.cfg.EgressAllow, Deny: r.deny, Self: r.self,
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
	if len(req.EgressDomains) > 0 {
		resolver, err := r.resolverFor(req, ip)
		if err != nil {
			return p, err
		}
		p.Resolver, p.ResolvedSet = resolver, resolvedSet(req.Pod.UID)
	}
	// Denied ranges only narrow: a pool without internet egress takes them
	// too (they may cut its Allow exceptions).
	deny, err := sandboxnet.ParsePrefixes(strings.Join(req.EgressDeny, ","))
	if err != nil {
		return p, fmt.Errorf("bind %s: egress deny: %v: %w", req.Pod.UID, err, errdefs.ErrInvalidArgument)
	}
	p.PodDeny = deny
	p.TCPPorts = nil
	var daemons []uint16
	for i, c := range req.Containers {
		daemons = append(daemons, uint16(api.Port+i))
		p.TCPPorts = append(p.TCPPorts, uint16(api.Port+i))
		for _, port := range c.Ports {
			if port.Protocol == "UDP" {
				p.UDPPorts = append(p.UDPPorts, uint16(port.Port))
			} else {
				p.TCPPorts = append(p.TCPPorts, uint16(port.Port))
			}
		}
	}
	if r.cfg.Policies != nil {
		// The node itself (this agent, host-network components) reaches
		// the daemons whatever the rules say (Policy.Self).
		p.IngressFrom, p.EgressTo = r.cfg.Policies.Rules(req.Pod.Namespace, req.Pod.Name, daemons)
	}
	if len(req.ControlPorts) > 0 {
		ports, err := sandboxnet.ParsePorts(strings.Join(req.ControlPorts, ","))
		if err != nil {
			return p, fmt.Errorf("bind %s: control ports: %v: %w", req.Pod.UID, err, errdefs.ErrInvalidArgument)
		}
		p.ControlPorts = ports
		if cp, ok := r.cfg.Policies.(ControlPeers); ok {
			p.ControlFrom = cp.ControlPeers()
		}
	}
	p.DaemonPorts = daemons
	return p, nil
}

// resolverFor is where the DNS of the sandbox at ip goes, for a pod that
// allows names: the node's resolver, at the node's address the slot
// reaches it by (the one the node sends to ip from: the slot network's
// gateway).
func (r *Runtime) resolverFor(req *runtime.BindRequest, ip string) (netip.AddrPort, error) {
	switch {
	case !r.cfg.EgressInternet:
		return netip.AddrPort{}, fmt.Errorf("bind %s: the pod allows names (sandman.io/egress-domains) but this pool allows sandboxes no internet egress at all: remove the annotation, or ask the operator for a pool with egress: %w",
			req.Pod.UID, errdefs.ErrInvalidArgument)
	case r.cfg.DNS == nil:
		return netip.AddrPort{}, fmt.Errorf("bind %s: the pod allows names (sandman.io/egress-domains) but this node runs no resolver for sandboxes (sandman-node --dns-listen): remove the annotation, or ask the operator to enable it: %w",
			req.Pod.UID, errdefs.ErrInvalidArgument)
	}
	slotIP, err := netip.ParseAddr(ip)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("bind %s: the slot has no address (%q) to resolve names for", req.Pod.UID, ip)
	}
	src, err := r.routeSrc(slotIP)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("bind %s: the node's address towards its sandbox %s: %w", req.Pod.UID, ip, err)
	}
	return netip.AddrPortFrom(src, r.cfg.DNS.Port()), nil
}

// routeSrc is the address the node sends to dst from.
func routeSrc(dst netip.Addr) (netip.Addr, error) {
	routes, err := netlink.RouteGet(dst.AsSlice())
	if err != nil {
		return netip.Addr{}, err
	}
	for _, rt := range routes {
		if src, ok := netip.AddrFromSlice(rt.Src); ok && src.Unmap().Is4() {
			return src.Unmap(), nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no route to %s with a source address", dst)
}

// resolvedSet names the set of a pod's pinned addresses: its own, so a
// late answer to the slot's previous pod pins nothing for the next.
func resolvedSet(uid string) string { return "resolved_" + uid }

// resolveNames sends the DNS of the sandbox in slot s to the node's
// resolver, which answers it the pod's names, pinning their addresses in
// the pod's set (after its firewall is written). Queries an image sends to
// 127.0.0.1 (no server in its resolv.conf) are redirected too: that needs
// route_localnet in the slot's namespace.
func (r *Runtime) resolveNames(s *slot, req *runtime.BindRequest) error {
	if len(req.EgressDomains) == 0 || r.cfg.NoFirewall {
		return nil
	}
	nsPath := s.netns.GetPath()
	if err := routeLocalnet(nsPath); err != nil {
		return fmt.Errorf("bind %s: %w", req.Pod.UID, err)
	}
	ip, err := netip.ParseAddr(s.IP)
	if err != nil {
		return fmt.Errorf("bind %s: the slot has no address (%q) to resolve names for", req.Pod.UID, s.IP)
	}
	set := resolvedSet(req.Pod.UID)
	if err := r.cfg.DNS.Register(ip, req.EgressDomains, func(addrs []netip.Addr, ttl time.Duration) error {
		return sandboxnet.Pin(nsPath, set, addrs, ttl)
	}); err != nil {
		return fmt.Errorf("bind %s: egress domains: %v: %w", req.Pod.UID, err, errdefs.ErrInvalidArgument)
	}
	return nil
}

// forgetNames stops resolving names for the sandbox in slot s (released,
// or its bind failed).
func (r *Runtime) forgetNames(s *slot) {
	if r.cfg.DNS == nil {
		return
	}
	if ip, err := netip.ParseAddr(s.IP); err == nil {
		r.cfg.DNS.Unregister(ip)
	}
}

// routeLocalnet lets packets from 127.0.0.0/8 be routed out of the
// namespace at nsPath (once the firewall has given them the slot's
// address): DNS sent to 127.0.0.1 and redirected to the node's resolver.
func routeLocalnet(nsPath string) error {
	err := inNetNS(nsPath, func() error {
		return os.WriteFile("/proc/sys/net/ipv4/conf/all/route_localnet", []byte("1"), 0)
	})
	if err != nil {
		return fmt.Errorf("route the loopback's DNS out of %s: %w", nsPath, err)
	}
	return nil
}

// RefreshFirewalls writes again the firewall of every bound sandbox, for
// a change of the policies that select them.
func (r *Runtime) RefreshFirewalls() {
	type bound struct {
		ns, ip string
		req    runtime.BindRequest
	}
	var list []bound
	r.mu.Lock()
	for _, s := range r.slots {
		if s.fwReq != nil && s.Pod != nil && (s.State == runtime.StateBound || s.State == runtime.StatePaused) {
			list = append(list, bound{s.netns.GetPath(), s.IP, *s.fwReq})
		}
	}
	r.mu.Unlock()
	for _, b := range list {
		if _, err := r.firewall(b.ns, b.ip, &b.req, false); err != nil {
			r.log.Warn("refresh a sandbox's firewall", "pod", b.req.Pod.Namespace+"/"+b.req.Pod.Name, "err", err)
		}
	}
}

// firewall writes a slot's firewall into its network namespace: with no
// request, its base (Reset: the slot is clean); for a pod on a clean slot,
// the pod's parts added to the base (AddPod, ~0.1 ms: no deletion, which
// would wait for a kernel grace period); otherwise the whole firewall
// replaced (Apply, ~13 ms). ip is the slot's address. It returns whether
// the slot is clean after.
func (r *Runtime) firewall(nsPath, ip string, req *runtime.BindRequest, clean bool) (bool, error) {
	if r.cfg.NoFirewall {
		return true, nil
	}
	p, err := r.policy(req, ip)
	if err != nil {
		return clean, err
	}
	t := time.Now()
	switch {
	case req == nil:
		err = sandboxnet.Reset(nsPath, p)
	case clean:
		err = sandboxnet.AddPod(nsPath, p)
	default:
		err = sandboxnet.Apply(nsPath, p)
	}
	if err != nil {
		return false, errors.Join(err, errors.New("the node's kernel needs nf_tables (or run the agent with --no-sandbox-firewall, which lets sandboxes reach everything the node can)"))
	}
	r.metrics.observePhase("firewall", t)
	return req == nil, nil
}

// bindFirewall writes the bound pod's firewall into slot s.
func (r *Runtime) bindFirewall(s *slot, req *runtime.BindRequest) error {
	r.mu.Lock()
	clean := s.fwClean
	s.fwClean = false
	r.mu.Unlock()
	_, err := r.firewall(s.netns.GetPath(), s.IP, req, clean)
	if err != nil {
		return err
	}
	if err := r.resolveNames(s, req); err != nil {
		return err
	}
	r.mu.Lock()
	s.fwReq = firewallRequest(*req)
	r.mu.Unlock()
	return nil
}

// firewallRequest keeps of req what its firewall needs.
func firewallRequest(req runtime.BindRequest) *runtime.BindRequest {
	fw := &runtime.BindRequest{Pod: req.Pod, Egress: req.Egress, EgressDeny: req.EgressDeny, EgressDomains: req.EgressDomains, ControlPorts: req.ControlPorts}
	for _, c := range req.Containers {
		fw.Containers = append(fw.Containers, runtime.ContainerSpec{Name: c.Name, Ports: c.Ports})
	}
	return fw
}

// shape sets the bound pod's bandwidth caps on its slot (and removes the
// caps of the slot's previous pod).
func (r *Runtime) shape(s *slot, req *runtime.BindRequest) error {
	b := sandboxnet.Bandwidth{Ingress: req.IngressBandwidth, Egress: req.EgressBandwidth}
	r.mu.Lock()
	was := s.shaped
	r.mu.Unlock()
	if b == (sandboxnet.Bandwidth{}) && !was {
		return nil
	}
	t := time.Now()
	if err := sandboxnet.SetBandwidth(s.netns.GetPath(), b); err != nil {
		return fmt.Errorf("bind %s: %w", req.Pod.UID, err)
	}
	r.mu.Lock()
	s.shaped = b != (sandboxnet.Bandwidth{})
	r.mu.Unlock()
	r.metrics.observePhase("bandwidth", t)
	return nil
}

// SetEgress implements runtime.EgressSetter: the bound (or paused) pod's
// firewall is rewritten whole with e in place of its egress, and its names
// registered anew. A paused sandbox gets the new rules too: its network
// namespace stays, and it finds them when it is resumed.
func (r *Runtime) SetEgress(ctx context.Context, uid string, e runtime.Egress) error {
	if err := e.Validate(); err != nil {
		return fmt.Errorf("egress of %s: %w", uid, err)
	}
	r.mu.Lock()
	s, ok := r.byPod[uid]
	var req runtime.BindRequest
	switch {
	case !ok:
		r.mu.Unlock()
		return fmt.Errorf("egress of %s: pod not on node %s: %w", uid, r.cfg.Node, errdefs.ErrNotFound)
	case s.fwReq == nil || s.State != runtime.StateBound && s.State != runtime.StatePaused || s.egressing:
		state := s.State
		if s.egressing {
			state = "having its egress changed"
		}
		r.mu.Unlock()
		return fmt.Errorf("egress of %s: the pod is %s: %w", uid, state, errdefs.ErrFailedPrecondition)
	default:
		req = *s.fwReq
		s.egressing = true
	}
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		s.egressing = false
		r.mu.Unlock()
	}()
	old := req
	req.Egress, req.EgressDeny, req.EgressDomains = e.Egress, e.EgressDeny, e.EgressDomains
	// The policy is checked before anything changes: a pool without
	// internet egress refuses one that asks for it.
	if _, err := r.policy(&req, s.IP); err != nil {
		return fmt.Errorf("egress of %s: %w", uid, err)
	}
	if _, err := r.firewall(s.netns.GetPath(), s.IP, &req, false); err != nil {
		return fmt.Errorf("egress of %s: %w", uid, err)
	}
	r.forgetNames(s)
	if err := r.resolveNames(s, &req); err != nil {
		// Back to what it had: its names and firewall.
		if _, ferr := r.firewall(s.netns.GetPath(), s.IP, &old, false); ferr == nil {
			_ = r.resolveNames(s, &old)
		}
		return fmt.Errorf("egress of %s: %w", uid, err)
	}
	r.mu.Lock()
	s.fwReq = firewallRequest(req)
	r.mu.Unlock()
	r.log.Info("egress changed", "pod", uid, "slot", s.ID, "egress", e.Egress, "deny", e.EgressDeny, "domains", e.EgressDomains)
	return nil
}

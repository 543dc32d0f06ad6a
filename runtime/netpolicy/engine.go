package netpolicy

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	netlisters "k8s.io/client-go/listers/networking/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime/sandboxnet"
)

// Config configures an Engine.
type Config struct {
	// Client reads pods, namespaces and NetworkPolicies (required).
	Client kubernetes.Interface
	// ControlNamespaces hold the pods that always reach sandbox daemons
	// (sandman-vk, the gateway).
	ControlNamespaces []string
	// OnChange is called, at most every Debounce (default 200 ms), after
	// something that may change a sandbox's rules changed.
	OnChange func()
	Debounce time.Duration
	Logger   *slog.Logger
}

// Engine answers the NetworkPolicy rules of sandbox pods. Create it with
// New and start it with Run.
type Engine struct {
	cfg     Config
	factory informers.SharedInformerFactory
	pods    corelisters.PodLister
	nss     corelisters.NamespaceLister
	nps     netlisters.NetworkPolicyLister
	kick    chan struct{}
	synced  chan struct{}
	once    sync.Once
}

// New checks cfg and sets up the informers.
func New(cfg Config) (*Engine, error) {
	if cfg.Client == nil {
		return nil, errors.New("netpolicy: a Kubernetes client is required")
	}
	if cfg.Debounce <= 0 {
		cfg.Debounce = 200 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.OnChange == nil {
		cfg.OnChange = func() {}
	}
	e := &Engine{cfg: cfg, kick: make(chan struct{}, 1), synced: make(chan struct{})}
	e.factory = informers.NewSharedInformerFactoryWithOptions(cfg.Client, 0, informers.WithTransform(trim))
	podInf := e.factory.Core().V1().Pods()
	nsInf := e.factory.Core().V1().Namespaces()
	npInf := e.factory.Networking().V1().NetworkPolicies()
	e.pods, e.nss, e.nps = podInf.Lister(), nsInf.Lister(), npInf.Lister()
	kick := func(any) { e.changed() }
	all := cache.ResourceEventHandlerFuncs{AddFunc: kick, DeleteFunc: kick, UpdateFunc: func(_, o any) { kick(o) }}
	if _, err := nsInf.Informer().AddEventHandler(all); err != nil {
		return nil, err
	}
	if _, err := npInf.Informer().AddEventHandler(all); err != nil {
		return nil, err
	}
	if _, err := podInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(o any) { e.podChanged(nil, o) },
		UpdateFunc: e.podChanged,
		DeleteFunc: func(o any) { e.podChanged(o, nil) },
	}); err != nil {
		return nil, err
	}
	return e, nil
}

// trim keeps what rules need of pods (labels, node selector, addresses).
func trim(obj any) (any, error) {
	if pod, ok := obj.(*corev1.Pod); ok {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: pod.Name, Namespace: pod.Namespace, UID: pod.UID, Labels: pod.Labels,
				ResourceVersion: pod.ResourceVersion},
			Spec:   corev1.PodSpec{NodeSelector: pod.Spec.NodeSelector, NodeName: pod.Spec.NodeName},
			Status: corev1.PodStatus{PodIPs: pod.Status.PodIPs, PodIP: pod.Status.PodIP},
		}, nil
	}
	if m, ok := obj.(metav1.ObjectMetaAccessor); ok {
		m.GetObjectMeta().SetManagedFields(nil)
	}
	return obj, nil
}

// podChanged kicks OnChange for a peer pod's arrival, departure or address
// or label change, and for a sandbox pod's label change.
func (e *Engine) podChanged(old, cur any) {
	o, _ := old.(*corev1.Pod)
	c, _ := cur.(*corev1.Pod)
	switch {
	case o == nil || c == nil:
		if p := cmpOr(o, c); p != nil && !isSandbox(p) {
			e.changed()
		}
	case !maps(o.Labels, c.Labels):
		e.changed()
	case !isSandbox(c) && o.Status.PodIP != c.Status.PodIP:
		e.changed()
	}
}

func cmpOr(a, b *corev1.Pod) *corev1.Pod {
	if a != nil {
		return a
	}
	return b
}

func maps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// isSandbox: a sandbox pod's nodeSelector names a sandman pool.
func isSandbox(p *corev1.Pod) bool { return p.Spec.NodeSelector[podcontract.LabelPool] != "" }

func (e *Engine) changed() {
	select {
	case e.kick <- struct{}{}:
	default:
	}
}

// Run starts the informers and calls OnChange after changes until ctx ends.
func (e *Engine) Run(ctx context.Context) error {
	e.factory.Start(ctx.Done())
	defer e.factory.Shutdown()
	for typ, ok := range e.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			return errors.New("netpolicy: " + typ.String() + " informer did not sync")
		}
	}
	e.once.Do(func() { close(e.synced) })
	e.cfg.Logger.Info("network policies watched")
	e.cfg.OnChange()
	t := time.NewTimer(0)
	<-t.C
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-e.kick:
			t.Reset(e.cfg.Debounce)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			e.cfg.OnChange()
		}
	}
}

// Synced is closed once the informers have synced.
func (e *Engine) Synced() <-chan struct{} { return e.synced }

// Rules are the ingress and egress rules of the sandbox pod ns/name whose
// daemons listen on daemonPorts. Ingress is never nil (who may reach a
// sandbox is always narrowed); egress is nil when no egress policy
// selects the pod.
func (e *Engine) Rules(ns, name string, daemonPorts []uint16) (ingress, egress []sandboxnet.Rule) {
	var podLabels labels.Set
	if pod, err := e.pods.Pods(ns).Get(name); err == nil {
		podLabels = pod.Labels
	}
	var control []sandboxnet.Peer
	for _, cns := range e.cfg.ControlNamespaces {
		control = append(control, e.podPeers([]string{cns}, labels.Everything())...)
	}
	var daemon []sandboxnet.PortRange
	for _, p := range daemonPorts {
		daemon = append(daemon, sandboxnet.PortRange{Proto: "TCP", Port: p})
	}
	ingress = []sandboxnet.Rule{}
	if len(control) > 0 {
		ingress = append(ingress, sandboxnet.Rule{Peers: control, Ports: daemon})
	}
	policies, _ := e.nps.NetworkPolicies(ns).List(labels.Everything())
	var in, out []*networkingv1.NetworkPolicy
	for _, np := range policies {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil || !sel.Matches(podLabels) {
			continue
		}
		if hasType(np, networkingv1.PolicyTypeIngress) {
			in = append(in, np)
		}
		if hasType(np, networkingv1.PolicyTypeEgress) {
			out = append(out, np)
		}
	}
	if len(in) == 0 {
		// By default: the pod's own namespace (and the control namespaces,
		// above) on every open port.
		if own := e.podPeers([]string{ns}, labels.Everything()); len(own) > 0 || len(control) > 0 {
			ingress = append(ingress, sandboxnet.Rule{Peers: append(own, control...)})
		}
	}
	for _, np := range in {
		for _, r := range np.Spec.Ingress {
			if rule, ok := e.rule(ns, r.From, r.Ports); ok {
				ingress = append(ingress, rule)
			}
		}
	}
	if len(out) > 0 {
		egress = []sandboxnet.Rule{}
		for _, np := range out {
			for _, r := range np.Spec.Egress {
				if rule, ok := e.rule(ns, r.To, r.Ports); ok {
					egress = append(egress, rule)
				}
			}
		}
	}
	return ingress, egress
}

// ControlPeers are the addresses of the control namespaces' pods: they
// reach a sandbox's control ports (sandman.io/control-ports, where
// sandman-gateway forwards E2B's getHost traffic), which nobody else
// reaches and no NetworkPolicy opens.
func (e *Engine) ControlPeers() []netip.Prefix {
	var out []netip.Prefix
	for _, p := range e.podPeers(e.cfg.ControlNamespaces, labels.Everything()) {
		out = append(out, p.Prefix)
	}
	return out
}

func hasType(np *networkingv1.NetworkPolicy, t networkingv1.PolicyType) bool {
	if len(np.Spec.PolicyTypes) == 0 {
		// Kubernetes' default: Ingress, and Egress when egress rules exist.
		return t == networkingv1.PolicyTypeIngress || len(np.Spec.Egress) > 0
	}
	return slices.Contains(np.Spec.PolicyTypes, t)
}

// rule turns a policy rule's peers and ports into a sandboxnet rule; ok is
// false when it can match nothing (peers that select no address, only
// named ports).
func (e *Engine) rule(ns string, peers []networkingv1.NetworkPolicyPeer, ports []networkingv1.NetworkPolicyPort) (sandboxnet.Rule, bool) {
	var r sandboxnet.Rule
	for _, p := range ports {
		proto := "TCP"
		if p.Protocol != nil {
			proto = string(*p.Protocol)
		}
		if proto != "TCP" && proto != "UDP" {
			continue // SCTP: sandboxes speak TCP and UDP only
		}
		pr := sandboxnet.PortRange{Proto: proto}
		if p.Port != nil {
			if p.Port.IntVal <= 0 || p.Port.IntVal > 65535 {
				continue // a named port: not supported
			}
			pr.Port = uint16(p.Port.IntVal)
			if p.EndPort != nil && *p.EndPort > p.Port.IntVal && *p.EndPort <= 65535 {
				pr.EndPort = uint16(*p.EndPort)
			}
		}
		r.Ports = append(r.Ports, pr)
	}
	if len(ports) > 0 && len(r.Ports) == 0 {
		return r, false
	}
	if len(peers) == 0 {
		return r, true // any peer
	}
	for _, peer := range peers {
		switch {
		case peer.IPBlock != nil:
			pfx, err := netip.ParsePrefix(peer.IPBlock.CIDR)
			if err != nil || !pfx.Addr().Is4() {
				continue
			}
			p := sandboxnet.Peer{Prefix: pfx.Masked()}
			for _, ex := range peer.IPBlock.Except {
				if e, err := netip.ParsePrefix(ex); err == nil && e.Addr().Is4() {
					p.Except = append(p.Except, e.Masked())
				}
			}
			r.Peers = append(r.Peers, p)
		default:
			namespaces := []string{ns}
			if peer.NamespaceSelector != nil {
				namespaces = e.namespaces(peer.NamespaceSelector)
			}
			podSel := labels.Everything()
			if peer.PodSelector != nil {
				sel, err := metav1.LabelSelectorAsSelector(peer.PodSelector)
				if err != nil {
					continue
				}
				podSel = sel
			}
			r.Peers = append(r.Peers, e.podPeers(namespaces, podSel)...)
		}
	}
	return r, len(r.Peers) > 0
}

func (e *Engine) namespaces(sel *metav1.LabelSelector) []string {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return nil
	}
	list, _ := e.nss.List(s)
	var out []string
	for _, n := range list {
		out = append(out, n.Name)
	}
	return out
}

// podPeers are the IPv4 addresses of the non-sandbox pods in namespaces
// that sel selects.
func (e *Engine) podPeers(namespaces []string, sel labels.Selector) []sandboxnet.Peer {
	var out []sandboxnet.Peer
	for _, ns := range namespaces {
		pods, _ := e.pods.Pods(ns).List(sel)
		for _, p := range pods {
			if isSandbox(p) {
				continue
			}
			for _, ip := range p.Status.PodIPs {
				if a, err := netip.ParseAddr(ip.IP); err == nil && a.Is4() {
					out = append(out, sandboxnet.Peer{Prefix: netip.PrefixFrom(a, 32)})
				}
			}
		}
	}
	// Host-network pods share their node's address: one rule each.
	slices.SortFunc(out, func(a, b sandboxnet.Peer) int { return a.Prefix.Addr().Compare(b.Prefix.Addr()) })
	return slices.CompactFunc(out, func(a, b sandboxnet.Peer) bool { return a.Prefix == b.Prefix })
}

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"

	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/netpolicy"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/sandboxdns"
	"github.com/sandman-dev/sandman/runtime/sandboxnet"
)

// startPolicies runs the network policy engine with --network-policies
// (nil otherwise) until ctx ends: made first, since the runtime asks it at
// every bind; it refreshes the firewalls of the runtime stored in refresh
// once that exists.
func startPolicies(ctx context.Context, o options, refresh *atomic.Pointer[noderuntime.Runtime], log *slog.Logger) (noderuntime.PolicySource, error) {
	if !o.networkPolicies {
		return nil, nil
	}
	kc, err := kubeClient(o.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--network-policies: %w", err)
	}
	var cns []string
	for n := range strings.SplitSeq(o.controlNamespaces, ",") {
		if n = strings.TrimSpace(n); n != "" {
			cns = append(cns, n)
		}
	}
	engine, err := netpolicy.New(netpolicy.Config{Client: kc, ControlNamespaces: cns, Logger: log.With("subsystem", "netpolicy"),
		OnChange: func() {
			if rt := refresh.Load(); rt != nil {
				rt.RefreshFirewalls()
			}
		}})
	if err != nil {
		return nil, err
	}
	go func() {
		if err := engine.Run(ctx); err != nil {
			log.Error("network policies", "err", err)
		}
	}()
	return engine, nil
}

// connectRetrying connects (connect) until it succeeds, backing off from
// 1 s to 30 s and telling s why it does not serve yet, or until ctx ends.
func connectRetrying(ctx context.Context, s *server, o options, cniBinDir string, policies noderuntime.PolicySource, dns *sandboxdns.Server, log *slog.Logger) (*ctrd.Client, *noderuntime.Runtime, error) {
	for delay := time.Second; ; delay = min(2*delay, 30*time.Second) {
		client, rt, err := connect(ctx, o, o.res, o.cacheBytes, cniBinDir, policies, dns, log)
		if err == nil {
			return client, rt, nil
		}
		s.setStatus(err.Error())
		log.Error("not serving yet; retrying", "err", err, "retry_in", delay.String())
		select {
		case <-ctx.Done():
			_ = s.hs.Close()
			return nil, nil, fmt.Errorf("stopped before serving: %w", err)
		case <-time.After(delay):
		}
	}
}

// connect reaches containerd and builds the runtime (which loads the CNI
// config and recovers what a previous agent left).
func connect(ctx context.Context, o options, res runtime.Resources, cacheBytes int64, cniBinDir string, policies noderuntime.PolicySource, dns *sandboxdns.Server, log *slog.Logger) (*ctrd.Client, *noderuntime.Runtime, error) {
	if _, err := os.Stat(o.containerdAddress); err != nil {
		return nil, nil, fmt.Errorf("containerd unreachable at %s: %w (is --containerd-address the worker's containerd socket, mounted into the pod?)", o.containerdAddress, err)
	}
	client, err := ctrd.New(o.containerdAddress, ctrd.WithDefaultNamespace(o.namespace), ctrd.WithTimeout(10*time.Second))
	if err != nil {
		return nil, nil, fmt.Errorf("containerd unreachable at %s: %w", o.containerdAddress, err)
	}
	vctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := client.Version(vctx); err != nil {
		client.Close()
		return nil, nil, fmt.Errorf("containerd unreachable at %s: %w", o.containerdAddress, err)
	}
	var internet bool
	switch o.egress {
	case "none":
	case "internet":
		internet = true
	default:
		client.Close()
		return nil, nil, fmt.Errorf("--sandbox-egress %q: want none or internet", o.egress)
	}
	allow, err := sandboxnet.ParsePrefixes(o.egressAllow)
	if err != nil {
		client.Close()
		return nil, nil, fmt.Errorf("--sandbox-egress-allow: %w", err)
	}
	deny, err := sandboxnet.ParsePrefixes(o.egressDeny)
	if err != nil {
		client.Close()
		return nil, nil, fmt.Errorf("--sandbox-egress-deny: %w", err)
	}
	if o.noFirewall {
		log.Warn("--no-sandbox-firewall: sandboxes reach everything this node can")
	}
	cfg := noderuntime.Config{
		EgressInternet: internet, EgressAllow: allow, EgressDeny: deny, NoFirewall: o.noFirewall, Policies: policies,
		DiskInodes: o.diskInodes,
		Client:     client, Namespace: o.namespace, Node: o.node, Slots: o.slots, WarmSlots: o.warmSlots,
		Resources: res, StateDir: o.stateDir, DaemonPath: o.daemonPath,
		CNIConfDir: o.cniConfDir, CNIBinDir: cniBinDir, PidsLimit: o.pidsLimit, Logger: log,
		SeccompProfileRoot: o.seccompRoot,
		ShimGroupSize:      o.shimGroupSize,
		RuncPath:           o.runc, RunscPath: o.runsc, RunscPlatform: o.runscPlatform, UserNamespaces: noderuntime.UserNamespaces(o.userNS), UserNamespaceBase: uint32(o.userNSBase),
		RegistryHostsDir: o.hostsDir, ImageCacheBytes: cacheBytes, PrePull: o.prePull, PrePullConcurrency: o.prePullConcurrency,
		SnapshotRegistry: o.snapshotRegistry, SnapshotPushConfig: o.snapshotPushConfig, SnapshotScratchDir: o.snapshotScratchDir, CheckpointDir: o.checkpointDir, CheckpointRepository: o.checkpointRepository, Snapshotter: o.snapshotter, LazyPull: o.lazyPull, LazyConvertRepository: o.lazyConvertRepository, LazyMetricsURL: o.lazyMetricsURL, LazyCacheDir: o.lazyCacheDir, SnapshotRepositories: o.snapshotRepositories,
		HotSlots: o.hotBudget, HotImages: o.hotImages, HotMixWindow: o.hotMixWindow, HotMixHalfLife: o.hotMixHalfLife,
	}
	if dns != nil {
		cfg.DNS = dns
	}
	rt, err := noderuntime.New(ctx, cfg)
	if err != nil {
		client.Close()
		return nil, nil, err
	}
	return client, rt, nil
}

// startResolver opens the sandbox DNS resolver (--dns-listen) and serves
// it until ctx ends. Its upstreams are --dns-upstream, or the node's
// resolv.conf nameservers.
func startResolver(ctx context.Context, o options, log *slog.Logger) (*sandboxdns.Server, error) {
	var upstreams []string
	for u := range strings.SplitSeq(o.dnsUpstream, ",") {
		if u = strings.TrimSpace(u); u != "" {
			upstreams = append(upstreams, u)
		}
	}
	if len(upstreams) == 0 {
		b, err := os.ReadFile("/etc/resolv.conf")
		if err != nil {
			return nil, fmt.Errorf("--dns-upstream not given and the node's resolv.conf unreadable: %w", err)
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "nameserver" {
				upstreams = append(upstreams, f[1])
			}
		}
		if len(upstreams) == 0 {
			return nil, errors.New("--dns-upstream not given and /etc/resolv.conf names no nameserver: give the DNS servers sandbox names resolve through, or --dns-listen= for no resolver")
		}
	}
	dns, err := sandboxdns.New(sandboxdns.Config{Listen: o.dnsListen, Upstreams: upstreams, Logger: log.With("subsystem", "sandboxdns")})
	if err != nil {
		return nil, fmt.Errorf("--dns-listen, --dns-upstream: %w", err)
	}
	go func() {
		if err := dns.Run(ctx); err != nil {
			log.Error("sandbox DNS resolver", "err", err)
		}
	}()
	log.Info("sandbox DNS resolver", "port", dns.Port(), "upstreams", upstreams)
	return dns, nil
}

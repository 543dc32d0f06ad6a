// Command sandman-vk is the virtual node: a virtual-kubelet provider that
// places the pods scheduled onto it into warm slots of many node agents.
//
// Files: flags.go (the flags), kubelet.go (the kubelet port: serving
// certificate, TLS, authentication), poolsecret.go and controlkey.go (the
// node agents' credentials and the control keys), agents.go (static and
// discovered node agents), metrics.go, lead.go (what only the leader
// runs) and leader.go (the election), version.go.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"

	"github.com/sandman-dev/sandman/internal/buildinfo"
	"github.com/sandman-dev/sandman/pool"
	"github.com/sandman-dev/sandman/vk"
)

// version is what a release build stamps with -ldflags
// "-X main.version=v1.2.3"; empty, the build info says (buildinfo.Version).
var version string

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "sandman-vk: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	var o options
	fs := flag.NewFlagSet("sandman-vk", flag.ContinueOnError)
	o.bindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.printVersion {
		fmt.Println("sandman-vk", buildinfo.Version(version))
		return nil
	}
	if err := o.validate(); err != nil {
		return err
	}
	handler := slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: o.level})
	log := slog.New(handler).With("component", "vk")
	// client-go (informers, the certificate manager) logs through klog:
	// to this process's log.
	klog.SetSlogLogger(log)
	allowedNamespaces, namespaceSelector, err := poolAccess(o.allowedNamespaces, o.namespaceSelector, o.poolName, log)
	if err != nil {
		return err
	}
	hostUsersNamespaces, err := namespaceList("--host-users-namespaces", o.hostUsersNamespaces)
	if err != nil {
		return err
	}
	privilegeEscalationNamespaces, err := namespaceList("--privilege-escalation-namespaces", o.privilegeEscalationNamespaces)
	if err != nil {
		return err
	}
	// Every listener is bound now, before anything waits (the apiserver,
	// the node agents, a serving certificate): a taken address fails the
	// process at once, naming it. The kubelet port is bound when it is to
	// be served (with TLS) and serves only while this process leads.
	var kubeletL net.Listener
	if o.serving == servingCSR || o.tlsCert != "" {
		if kubeletL, err = listen("--kubelet-listen", o.kubeletListen); err != nil {
			return err
		}
		defer kubeletL.Close()
	}
	ml, err := listen("--metrics-listen", o.metricsListen)
	if err != nil {
		return err
	}
	defer ml.Close()

	restCfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	restCfg.QPS, restCfg.Burst = float32(o.qps), o.burst
	vk.ConfigureClient(restCfg, o.nodeName)
	client, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}

	// Goroutines that watch files end with ctx; wg waits, after stop has
	// ended ctx (deferred later, so it runs first): an error return must
	// not wait for a signal.
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	apiCerts, token, err := poolCredentials(ctx, o, client, log)
	if err != nil {
		return err
	}
	certs, err := startServingCert(ctx, &wg, o, client, log)
	if err != nil {
		return err
	}
	controlKeys, err := loadControlKeys(ctx, &wg, o, client, token, log)
	if err != nil {
		return err
	}
	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "sandman-vk", Host: o.nodeName})

	// Every replica stands by warm: it follows the node agents (the pool's
	// watch streams), syncs the virtual node's informers and has its
	// kubelet serving certificate. Only the leader runs what writes
	// (lead.go).
	var provider *vk.Provider
	defer func() {
		if provider != nil {
			provider.Close()
		}
	}()
	var leaderEpoch atomic.Uint64
	var clients agentClients
	pl, err := pool.New(pool.Config{
		Name: o.poolName, MaxQueued: o.maxQueued, MaxQueuedPerNamespace: o.maxQueuedPerNamespace, NamespaceWeights: o.namespaceWeights,
		BindsPerNode: o.bindsPerNode, SnapshotsPerNode: o.snapshotsPerNode, LostAfter: o.lost, Logger: log,
		OnUpdate: func(u pool.Update) { provider.OnUpdate(u) },
	})
	if err != nil {
		return err
	}
	if err := connectAgents(ctx, o, agentsConfig{client: client, apiCerts: apiCerts, token: token, pool: pl,
		clients: &clients, epoch: leaderEpoch.Load, log: log}); err != nil {
		return err
	}
	// Adopt what the node agents hold before the pod controller starts,
	// so no running sandbox is placed twice.
	syncCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	if err := pl.WaitSynced(syncCtx); err != nil {
		log.Warn("not every node agent answered in time; continuing with those that did", "err", err)
	}
	cancel()
	if certs != nil {
		if err := waitServingCert(ctx, o, certs, log); err != nil {
			return err
		}
	}

	mux, kubeletHandler, kubeletTLS, err := kubeletServer(ctx, &wg, o, client, certs, log)
	if err != nil {
		return err
	}
	vnode, err := vk.NewNode(vk.Config{
		NodeName: o.nodeName, Pool: pl, QueueRoom: o.queueRoom, Client: client, Recorder: recorder,
		NodeIP: o.nodeIP, AllowUnauthenticated: o.allowUnauthenticated, ControlKeys: controlKeys,
		ReconcileInterval: o.reconcile, OrphanGrace: o.orphanGrace, AutoPauseAfter: o.autoPauseAfter, MovePausedAfter: o.movePausedAfter, KeepPaused: o.keepPaused, Logger: log, SelfUsage: selfUsage,
		UsageInterval: o.usageInterval, UsageRate: o.usageRate,
		DefaultLimits: o.defaultLimits.l, MaxLimits: o.maxLimits.l, PidsLimit: o.pidsLimit,
		AllowedNamespaces: allowedNamespaces, AllowedNamespaceSelector: namespaceSelector,
		HostUsersNamespaces: hostUsersNamespaces, PrivilegeEscalationNamespaces: privilegeEscalationNamespaces,
		DefaultBandwidth: o.defaultBandwidth.b, MaxBandwidth: o.maxBandwidth.b,
		SeccompLocalhostProfiles: commaList(o.seccompProfiles),
	},
		vk.WithKubeletPort(kubeletPort(o.kubeletListen)), vk.WithKubeletVersion(kubeletVersion()),
		vk.WithWorkers(o.workers), vk.WithInformerResync(o.resync), vk.WithPodWatch(vk.PodWatch(o.podWatch)),
		vk.WithRoutes(mux, kubeletTLS),
		vk.WithControllerLogger(slog.New(handler).With("component", "virtual-kubelet", "vnode", o.nodeName)),
	)
	if err != nil {
		return err
	}
	provider = vnode.Provider()
	if err := vnode.Sync(ctx); err != nil {
		return err
	}
	msrv := serveMetrics(ml, o, pl, provider)
	defer msrv.Close()

	return (&leader{
		o: o, client: client, pool: pl, node: vnode, clients: &clients, epoch: &leaderEpoch,
		kubeletL: kubeletL, kubeletTLS: kubeletTLS, kubeletHandler: kubeletHandler, log: log,
	}).run(ctx)
}

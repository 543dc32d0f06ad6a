package vk

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	vklog "github.com/virtual-kubelet/virtual-kubelet/log"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
)

// Node is the virtual node: virtual-kubelet's node and pod controllers
// (nodeutil) around a Provider, with the informers they read, tuned for
// a pool's bursts. NewNode builds it; Sync starts its informers (a
// standby holds them warm); Run runs the controllers while this process
// leads.
type Node struct {
	provider  *Provider
	vnode     *nodeutil.Node
	informers []cache.SharedIndexInformer
}

// NodeOpt sets what NewNode builds beyond the provider's Config, as
// virtual-kubelet's nodeutil.NodeOpt sets its node.
type NodeOpt func(*nodeOptions)

type nodeOptions struct {
	kubeletPort int32
	version     string
	workers     int
	resync      time.Duration
	podWatch    PodWatch
	routes      *http.ServeMux
	kubeletTLS  *tls.Config
	logger      *slog.Logger
}

// PodWatch is how the virtual node watches its pods.
type PodWatch string

const (
	// PodWatchAssigned watches all pods bound to any node and drops the
	// other nodes' here: the apiserver buffers such a watch 342–1,000
	// events deep (podwatch.go).
	PodWatchAssigned PodWatch = "assigned"
	// PodWatchNode watches spec.nodeName=<node>, as a kubelet: a 10-event
	// buffer, which the apiserver closes whenever a burst of this node's
	// pods outruns it.
	PodWatchNode PodWatch = "node"
)

// WithKubeletPort is the kubelet API port the node advertises (its
// daemon endpoint; default 10250).
func WithKubeletPort(port int32) NodeOpt { return func(o *nodeOptions) { o.kubeletPort = port } }

// WithKubeletVersion is the kubelet version the node reports.
func WithKubeletVersion(v string) NodeOpt { return func(o *nodeOptions) { o.version = v } }

// WithWorkers is the pod controller's workers per queue (default:
// nodeutil's).
func WithWorkers(n int) NodeOpt { return func(o *nodeOptions) { o.workers = n } }

// WithInformerResync is the informers' resync period (0: none).
func WithInformerResync(d time.Duration) NodeOpt { return func(o *nodeOptions) { o.resync = d } }

// WithPodWatch is how the node's pods are watched (default
// PodWatchAssigned).
func WithPodWatch(w PodWatch) NodeOpt { return func(o *nodeOptions) { o.podWatch = w } }

// WithRoutes attaches the kubelet API (exec, logs, stats) and sandman's
// own routes (images, pre-pull) to mux, which the caller serves on the
// kubelet port with TLS (c, nil: the port is not served).
func WithRoutes(mux *http.ServeMux, c *tls.Config) NodeOpt {
	return func(o *nodeOptions) { o.routes, o.kubeletTLS = mux, c }
}

// WithControllerLogger sends virtual-kubelet's pod and node controllers'
// messages, errors syncing pods among them, to l: it sets
// virtual-kubelet's process-wide log.L, which discards everything until
// set (see vkLogger).
func WithControllerLogger(l *slog.Logger) NodeOpt { return func(o *nodeOptions) { o.logger = l } }

// NewNode builds the virtual node around the Provider that cfg
// configures. cfg.Pods and cfg.Secrets come from the node's informers;
// cfg.RuntimeClasses and, with cfg.AllowedNamespaceSelector,
// cfg.Namespaces are read from informers of its own when unset;
// cfg.Recorder is kept quiet about virtual-kubelet's routine events.
func NewNode(cfg Config, opts ...NodeOpt) (*Node, error) {
	o := nodeOptions{kubeletPort: 10250, podWatch: PodWatchAssigned}
	for _, opt := range opts {
		opt(&o)
	}
	if cfg.Client == nil || cfg.Pool == nil {
		return nil, errors.New("vk: NewNode needs Config.Client and Config.Pool")
	}
	if o.logger != nil {
		vklog.L = vkLogger(o.logger)
	}
	n := &Node{}
	if cfg.Recorder != nil {
		cfg.Recorder = quietRecorder{EventRecorder: cfg.Recorder}
	}
	// RuntimeClasses: a pod's runtimeClassName becomes its handler (runc
	// or runsc), as a kubelet resolves it.
	if cfg.RuntimeClasses == nil {
		rc := kubeinformers.NewSharedInformerFactory(cfg.Client, o.resync).Node().V1().RuntimeClasses()
		cfg.RuntimeClasses = rc.Lister()
		n.informers = append(n.informers, rc.Informer())
	}
	// Namespaces: their labels, for the allowed namespace selector.
	if cfg.AllowedNamespaceSelector != nil && cfg.Namespaces == nil {
		ns := kubeinformers.NewSharedInformerFactory(cfg.Client, o.resync).Core().V1().Namespaces()
		cfg.Namespaces = ns.Lister()
		n.informers = append(n.informers, ns.Informer())
	}
	np := &nodeProvider{
		Config: nodeConfig{Name: cfg.NodeName, PoolName: cfg.Pool.Name(), IP: cfg.NodeIP, KubeletPort: o.kubeletPort, Version: o.version, QueueRoom: cfg.QueueRoom},
		Pool:   cfg.Pool, Nodes: cfg.Client.CoreV1().Nodes(), Logger: cfg.Logger,
	}
	capa, agents := np.capacity()
	spec := nodeSpec(np.Config, capa, agents)
	nodeClient := cfg.Client
	if o.podWatch == PodWatchAssigned {
		nodeClient = widePodWatch(cfg.Client, cfg.NodeName)
	}
	var podInformer cache.SharedIndexInformer
	nodeOpts := []nodeutil.NodeOpt{
		nodeutil.WithClient(nodeClient),
		func(c *nodeutil.NodeConfig) error {
			c.NodeSpec = spec
			c.InformerResyncPeriod = o.resync
			if o.workers > 0 {
				c.NumWorkers = o.workers
			}
			c.EventRecorder = cfg.Recorder
			// The kubelet port is served by the caller, on a listener it
			// bound at start: nodeutil, given no handler, serves none.
			c.TLSConfig = o.kubeletTLS
			c.Handler = nil
			return nil
		},
		nodeutil.WithPodControllerConfigOverrides(func(c *node.PodControllerConfig) error {
			// Tens of thousands of pods are cached: without their
			// managedFields (which nothing here reads) each takes far less.
			if err := c.PodInformer.Informer().SetTransform(trimPod); err != nil {
				return err
			}
			// Status writes change only the status (statuswrite.go).
			c.PodClient = statusWritesOnly(c.PodClient, c.PodInformer.Lister())
			podInformer = c.PodInformer.Informer()
			n.informers = append(n.informers, podInformer, c.SecretInformer.Informer(),
				c.ConfigMapInformer.Informer(), c.ServiceInformer.Informer())
			// Bursts: no token-bucket throttling, per-item back-off only;
			// pods that wait for capacity wait in the pool, not here.
			c.SyncPodsFromKubernetesRateLimiter = workqueue.NewTypedItemExponentialFailureRateLimiter[any](5*time.Millisecond, 10*time.Second)
			c.DeletePodsFromKubernetesRateLimiter = workqueue.NewTypedItemExponentialFailureRateLimiter[any](5*time.Millisecond, 10*time.Second)
			c.SyncPodStatusFromProviderRateLimiter = workqueue.NewTypedItemExponentialFailureRateLimiter[any](5*time.Millisecond, 10*time.Second)
			c.SyncPodsFromKubernetesShouldRetryFunc = retryAlways
			c.SyncPodStatusFromProviderShouldRetryFunc = retryAlways
			c.DeletePodsFromKubernetesShouldRetryFunc = retryAlways
			return nil
		}),
	}
	if o.routes != nil {
		nodeOpts = append(nodeOpts, nodeutil.AttachProviderRoutes(o.routes))
	}
	vnode, err := nodeutil.NewNode(cfg.NodeName, func(pc nodeutil.ProviderConfig) (nodeutil.Provider, node.NodeProvider, error) {
		cfg.Pods, cfg.Secrets = pc.Pods, pc.Secrets
		p, err := New(cfg)
		n.provider = p
		return p, np, err
	}, nodeOpts...)
	if err != nil {
		return nil, err
	}
	n.vnode = vnode
	if o.routes != nil {
		n.provider.AttachAPI(o.routes)
	}
	// A deleted pod's slot is released when the informer sees the
	// deletion, not when virtual-kubelet's sync queue gets to it.
	if _, err := podInformer.AddEventHandler(n.provider.DeletionHandler()); err != nil {
		return nil, err
	}
	return n, nil
}

// Provider is the node's provider.
func (n *Node) Provider() *Provider { return n.provider }

// Sync starts the node's informers and waits until they have synced (or
// ctx ends); they run until ctx ends. The controllers' own start of them
// when Run is called finds them running.
func (n *Node) Sync(ctx context.Context) error {
	synced := make([]cache.InformerSynced, 0, len(n.informers))
	for _, inf := range n.informers {
		go inf.Run(ctx.Done())
		synced = append(synced, inf.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("pod, secret, config map, service, RuntimeClass and namespace informers: %w", context.Cause(ctx))
	}
	return nil
}

// Run runs the node and pod controllers until ctx ends (then it returns
// ctx's error) or they fail.
func (n *Node) Run(ctx context.Context) error { return n.vnode.Run(ctx) }

// retryAlways retries a failed pod sync after 100 ms per try so far, at
// most 10 s.
func retryAlways(ctx context.Context, key string, timesTried int, originallyAdded time.Time, err error) (*time.Duration, error) {
	d := min(time.Duration(timesTried)*100*time.Millisecond, 10*time.Second)
	return &d, nil
}

// ConfigureClient tunes cfg, a virtual node's apiserver client
// configuration: it identifies as sandman-vk/<nodeName>, speaks protobuf,
// counts its requests (sandman_vk_apiserver_requests_total) and rides out
// apiserver outages.
func ConfigureClient(cfg *rest.Config, nodeName string) {
	cfg.UserAgent = "sandman-vk/" + nodeName
	// Protobuf, as the kubelet and kube-scheduler speak: a pod costs the
	// apiserver and sandman-vk a fraction of JSON's to encode and decode,
	// and the node's pod watch must keep up with every pod on the node
	// (the apiserver gives a watch by node name a buffer of 10 events and
	// closes it when it falls behind).
	cfg.ContentType = kruntime.ContentTypeProtobuf
	cfg.AcceptContentTypes = kruntime.ContentTypeProtobuf + "," + kruntime.ContentTypeJSON
	instrumentRESTConfig(cfg)
	// Informers notice a returning apiserver within a second, not after
	// client-go's back-off of up to a minute.
	waitForAPIServer(cfg, 500*time.Millisecond, 10*time.Minute)
}

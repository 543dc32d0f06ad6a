// Command sandman-vk is the virtual node: a virtual-kubelet provider that
// places the pods scheduled onto it into warm slots of many node agents.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	vklog "github.com/virtual-kubelet/virtual-kubelet/log"
	"github.com/virtual-kubelet/virtual-kubelet/node"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apiserver/pkg/server/dynamiccertificates"
	kubeinformers "k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/sandman-dev/sandman/pool"
	"github.com/sandman-dev/sandman/runtime/nodeapi"
	"github.com/sandman-dev/sandman/runtime/nodeapi/nodetls"
	"github.com/sandman-dev/sandman/vk"
	"github.com/sandman-dev/sandman/vk/kubeletauth"
	"github.com/sandman-dev/sandman/vk/kubeletcert"
)

type options struct {
	kubeconfig, nodeName, poolName, nodeIP string
	kubeletListen                          string
	tlsCert, tlsKey, clientCA              string
	anonymousAuth, tokenWebhook            bool
	authorizationMode                      string
	tokenCacheTTL, allowTTL, denyTTL       time.Duration
	servingCert                            string
	servingCertTimeout                     time.Duration
	agents, agentNamespace, agentSelector  string
	agentDaemonSet, agentServiceAccount    string
	nodeAPICASecret                        string
	ownerNamespace                         string
	agentPort                              int
	tokenFile, poolSecretFile              string
	poolSecretName, controlKeySecret       string
	controlKeySeedSecret                   string
	allowUnauthenticated, pprof            bool
	qps                                    float64
	burst, workers, bindsPerNode           int
	snapshotsPerNode                       int
	maxQueued, maxQueuedPerNamespace       int
	namespaceWeights                       namespaceWeights
	queueRoom                              int
	resync, reconcile, orphanGrace, lost   time.Duration
	metricsListen, logLevel                string
	podWatch                               string
	defaultLimits, maxLimits               resourceList
	defaultBandwidth, maxBandwidth         bandwidth
	pidsLimit                              int64
	allowedNamespaces, namespaceSelector   string
	hostUsersNamespaces                    string
	seccompProfiles                        string
	leaderElect                            bool
	leaderElectNamespace                   string
	leaseDuration, renewDeadline           time.Duration
	retryPeriod                            time.Duration
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "sandman-vk: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) (retErr error) {
	var o options
	fs := flag.NewFlagSet("sandman-vk", flag.ContinueOnError)
	fs.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig (default: in-cluster)")
	fs.StringVar(&o.poolName, "pool", "default", "pool name: the node's sandman.io/pool label and taint")
	fs.StringVar(&o.nodeName, "node-name", "", "virtual node name (default sandman-<pool>)")
	fs.StringVar(&o.nodeIP, "node-ip", "", "the virtual node's InternalIP while this process leads: where the apiserver reaches --kubelet-listen "+
		"(in a cluster with hostNetwork: the worker's status.hostIP); the IP in a --serving-cert=csr certificate. Default: env POD_IP")
	fs.StringVar(&o.kubeletListen, "kubelet-listen", ":10250", "kubelet API address (TLS; in a cluster next to a real kubelet, which owns 10250, use :10260)")
	fs.StringVar(&o.servingCert, "serving-cert", "", "where the kubelet serving certificate comes from: file (--tls-cert-file/--tls-key-file) or csr "+
		"(a kubernetes.io/kubelet-serving CertificateSigningRequest for system:node:<node-name> with --node-ip, which sandman-vk approves itself "+
		"and kube-controller-manager signs with the cluster CA; renewed before it expires; the kubelet API starts once it is issued). "+
		"Default: csr when running in-cluster (no --kubeconfig) without --tls-cert-file, else file")
	fs.DurationVar(&o.servingCertTimeout, "serving-cert-timeout", 2*time.Minute, "how long --serving-cert=csr waits for the first certificate before sandman-vk gives up")
	fs.StringVar(&o.tlsCert, "tls-cert-file", "", "kubelet serving certificate file (signed by the cluster CA); implies --serving-cert=file")
	fs.StringVar(&o.tlsKey, "tls-key-file", "", "kubelet serving key file")
	fs.StringVar(&o.clientCA, "client-ca-file", "", "CA that verifies kubelet API client certificates (the apiserver's kubelet client, metrics-server): "+
		"user = CN, groups = O, then authorized like any other (--authorization-mode); reloaded when the file changes. "+
		"Default with --serving-cert=csr: the in-cluster CA ("+inClusterCA+"); otherwise none, and client certificates authenticate no one")
	fs.BoolVar(&o.tokenWebhook, "authentication-token-webhook", true, "authenticate kubelet API bearer tokens with a TokenReview (RBAC: create tokenreviews)")
	fs.DurationVar(&o.tokenCacheTTL, "authentication-token-webhook-cache-ttl", kubeletauth.DefaultTokenCacheTTL, "how long a TokenReview's answer is kept")
	fs.BoolVar(&o.anonymousAuth, "anonymous-auth", false, "let kubelet API requests without a certificate or token through as system:anonymous (then authorized); "+
		"off: they get 401")
	fs.StringVar(&o.authorizationMode, "authorization-mode", string(kubeletauth.ModeWebhook), "how authenticated kubelet API requests are authorized: "+
		"Webhook (a SubjectAccessReview for nodes/proxy, nodes/log, nodes/stats, nodes/metrics… of this node, as a kubelet; RBAC: create subjectaccessreviews) "+
		"or AlwaysAllow (UNSAFE: whoever authenticates may exec into every sandbox; tests and local experiments only)")
	fs.DurationVar(&o.allowTTL, "authorization-webhook-cache-authorized-ttl", kubeletauth.DefaultAllowCacheTTL, "how long an allowed SubjectAccessReview is kept")
	fs.DurationVar(&o.denyTTL, "authorization-webhook-cache-unauthorized-ttl", kubeletauth.DefaultDenyCacheTTL, "how long a refused SubjectAccessReview is kept")
	fs.StringVar(&o.agents, "node-agents", "", "static node agents: name=host:port,… (instead of discovery)")
	fs.StringVar(&o.agentNamespace, "node-agent-namespace", "sandman-system", "namespace of the sandman-node DaemonSet's pods")
	fs.StringVar(&o.ownerNamespace, "owner-namespace", "", "make this namespace (the install's) the owner of the virtual node object, so deleting the install deletes the node too")
	fs.StringVar(&o.agentSelector, "node-agent-selector", "app.kubernetes.io/name=sandman-node", "label selector of the sandman-node pods")
	fs.IntVar(&o.agentPort, "node-agent-port", 9651, "node API port of discovered node agents")
	fs.StringVar(&o.agentDaemonSet, "node-agent-daemonset", "sandman-node", "the DaemonSet (in --node-agent-namespace) that must control a discovered agent pod: a pod with the label but another controller is never used")
	fs.StringVar(&o.agentServiceAccount, "node-agent-service-account", "sandman-node", "the ServiceAccount a discovered agent pod must run as (and make its certificate request with)")
	fs.StringVar(&o.nodeAPICASecret, "node-api-ca-secret", "", "namespace/name of the TLS Secret with the pool's node API CA (created when missing; only sandman-vk may read it): "+
		"the node API runs over mutual TLS, agents' certificates are signed by sandman-vk after checking the requesting pod (--node-agent-daemonset, --node-agent-service-account); "+
		"instead of a pool token")
	fs.StringVar(&o.tokenFile, "token-file", "", "file with the pool token node agents accept (or env SANDMAN_POOL_TOKEN, or --pool-secret-name)")
	fs.StringVar(&o.poolSecretName, "pool-secret-name", "", "namespace/name of a Secret whose key \"token\" is the pool token, created with a random token when missing "+
		"(the node agents mount the same Secret); instead of --token-file or SANDMAN_POOL_TOKEN")
	fs.StringVar(&o.poolSecretFile, "pool-secret-file", "", "file with the control keys, which derive the control plane's per-sandbox daemon tokens: one key a line, the current one first, "+
		"then previous ones (still tried; running sandboxes are re-keyed from them to the current key); read again when the file changes. Default: the pool token, fixed")
	fs.StringVar(&o.controlKeySecret, "control-key-secret", "", "namespace/name of the Secret with the control keys, which derive the control plane's per-sandbox daemon tokens "+
		"(only sandman-vk may read it): key \"control-key\" the current key, optional \"control-key-previous\" previous ones, one a line (still tried; running sandboxes are re-keyed "+
		"from them to the current key); created with a random key when missing, followed live. Instead of --pool-secret-file")
	fs.StringVar(&o.controlKeySeedSecret, "control-key-seed-secret", "", "namespace/name of a Secret whose key \"token\" derived the sandboxes' control tokens before --control-key-secret "+
		"(the pool secret of an earlier install): when sandman-vk creates the control key Secret, that token becomes its previous key, so running sandboxes are re-keyed rather than cut off. "+
		"Read only, and only then; a missing Secret is no error")
	fs.BoolVar(&o.pprof, "debug-pprof", false, "serve Go's /debug/pprof/ on --metrics-listen (profiles for benchmarks; keep the listener private)")
	fs.BoolVar(&o.allowUnauthenticated, "allow-unauthenticated", false, "let pods without a sandman.io/token-sha256 annotation run daemons without auth (local experiments only)")
	fs.Float64Var(&o.qps, "kube-api-qps", 500, "apiserver requests per second (client-go's default of 5 throttles bursts)")
	fs.IntVar(&o.burst, "kube-api-burst", 1000, "apiserver request burst")
	fs.IntVar(&o.workers, "workers", 32, "pod controller workers per queue")
	fs.StringVar(&o.podWatch, "pod-watch", "assigned", "how the node's pods are watched: assigned (all pods bound to any node, the other nodes' dropped here: the apiserver buffers such a watch 342–1,000 events deep) or node (spec.nodeName=<node>, as a kubelet: a 10-event buffer, which the apiserver closes whenever a burst of this node's pods outruns it)")
	fs.IntVar(&o.bindsPerNode, "binds-per-node", 16, "binds in flight per node agent")
	fs.IntVar(&o.snapshotsPerNode, "snapshots-per-node", 2, "snapshots taken at once per node agent (more wait their turn)")
	fs.IntVar(&o.maxQueued, "max-queued", 100000, "admission queue bound")
	fs.IntVar(&o.maxQueuedPerNamespace, "max-queued-per-namespace", 0, "admission queue bound of each namespace, so one tenant cannot fill the queue "+
		"(0: --max-queued; pods beyond it wait Pending and are submitted again)")
	fs.Var(&o.namespaceWeights, "namespace-weight", "a namespace's share of the pool where others have 1: ml=2 (repeatable, or comma-separated); "+
		"freed slots go first to the namespace holding the fewest per weight, then to the job inside it holding the fewest")
	fs.IntVar(&o.queueRoom, "queue-room", -1, "pods beyond its slots the virtual node advertises room for (CPU and memory scaled alike), so kube-scheduler binds a burst "+
		"that does not fit once and the pool's fair queue holds it; -1: the admission queue bound (--max-queued); 0: pods = slots, the truthful capacity "+
		"(pods beyond it stay unschedulable in kube-scheduler)")
	fs.DurationVar(&o.resync, "informer-resync", 0, "pod informer resync period (0: none; the reconciler compares state)")
	fs.DurationVar(&o.reconcile, "reconcile-interval", 10*time.Second, "how often slots and pods are compared")
	fs.DurationVar(&o.orphanGrace, "orphan-grace", 30*time.Second, "how long a slot whose pod is gone is kept before release")
	fs.DurationVar(&o.lost, "lost-after", 2*time.Minute, "how long a node agent may be unreachable before its running pods are failed as lost")
	fs.StringVar(&o.metricsListen, "metrics-listen", "127.0.0.1:9652", "Prometheus /metrics and /healthz address")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	o.defaultLimits, o.maxLimits = mustResourceList(defaultLimits), mustResourceList(maxLimits)
	fs.Var(&o.defaultLimits, "default-limits", "limits of a sandbox container that sets none: cpu, memory, ephemeral-storage (a larger request is the limit instead; empty: none)")
	fs.Var(&o.maxLimits, "max-limits", "largest request or limit a sandbox container may ask for: cpu, memory, ephemeral-storage (pods above are refused; empty: no maximum)")
	fs.StringVar(&o.allowedNamespaces, "allowed-namespaces", "", "namespaces whose pods may use this pool, comma-separated (with --allowed-namespace-selector: either admits); "+
		"a pod of any other fails NamespaceNotAllowed, however it reached the node (spec.nodeName included). Neither flag: every namespace (a warning at start)")
	fs.StringVar(&o.namespaceSelector, "allowed-namespace-selector", "", "label selector of the namespaces whose pods may use this pool (team=ml; RBAC: list/watch namespaces); see --allowed-namespaces")
	fs.StringVar(&o.hostUsersNamespaces, "host-users-namespaces", "", "namespaces whose pods may set hostUsers: true, the opt-out of the sandbox's user namespace "+
		"(root in the sandbox is then root on the worker, capabilities cut), comma-separated; any other's fail InvalidSpec. Empty: no pod may "+
		"(a node agent with --user-namespaces=required refuses them all anyway)")
	fs.Var(&o.defaultBandwidth, "default-bandwidth", "traffic caps of a sandbox whose pod sets no kubernetes.io/ingress-bandwidth or egress-bandwidth annotation, "+
		"in bits per second: ingress=100M,egress=100M (empty: none; with none, the --max-bandwidth of that direction)")
	fs.Var(&o.maxBandwidth, "max-bandwidth", "largest kubernetes.io/ingress-bandwidth and egress-bandwidth a pod may ask for: ingress=1G,egress=1G (pods above are refused; empty: no maximum)")
	fs.StringVar(&o.seccompProfiles, "seccomp-localhost-profiles", "", "the Localhost seccomp profiles pods may name, comma-separated paths relative to the node agents' "+
		"--seccomp-profile-root (a.json,profiles/b.json); a pod naming any other fails InvalidSpec. Empty: none")
	fs.Int64Var(&o.pidsLimit, "pids-limit", 1024, "processes per sandbox container (the node agent's own --pids-limit applies when lower; 0: the agent's)")
	fs.BoolVar(&o.leaderElect, "leader-elect", false, "run as one of several replicas: only the holder of the Lease sandman-vk-<node-name> places pods and runs the virtual node; "+
		"the others stand by warm (agents watched, informers synced) and take over when it goes. Off: this process is the only one")
	fs.StringVar(&o.leaderElectNamespace, "leader-elect-namespace", "", "namespace of the leader Lease (default: the pod's, from POD_NAMESPACE or the service account)")
	fs.DurationVar(&o.leaseDuration, "leader-elect-lease-duration", 10*time.Second, "how long standbys wait after the leader's last renewal before taking the Lease")
	fs.DurationVar(&o.renewDeadline, "leader-elect-renew-deadline", 7*time.Second, "how long the leader keeps trying to renew before it stops placing and exits (less than the lease duration)")
	fs.DurationVar(&o.retryPeriod, "leader-elect-retry-period", time.Second, "how often the Lease is tried (to take it, or to renew it), plus up to 1.2 times as much jitter; a standby leads at most lease duration + 2 jittered retry periods (14.4 s) after the leader's last renewal")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.nodeName == "" {
		o.nodeName = "sandman-" + o.poolName
	}
	if m := kubeletauth.Mode(o.authorizationMode); m != kubeletauth.ModeWebhook && m != kubeletauth.ModeAlwaysAllow {
		return fmt.Errorf("--authorization-mode: %q is neither %s nor %s", m, kubeletauth.ModeWebhook, kubeletauth.ModeAlwaysAllow)
	}
	if o.nodeIP == "" {
		// Each replica advertises its own address when it leads.
		o.nodeIP = os.Getenv("POD_IP")
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	handler := slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level})
	log := slog.New(handler).With("component", "vk")
	// client-go (informers, the certificate manager) logs through klog,
	// virtual-kubelet's pod and node controllers through its log.L, which
	// discards everything until set: both go to this process's log.
	klog.SetSlogLogger(log)
	vklog.L = vk.VKLogger(slog.New(handler).With("component", "virtual-kubelet", "vnode", o.nodeName))
	serving, err := servingMode(o)
	if err != nil {
		return err
	}
	var nodeIPs []net.IP
	if serving == servingCSR {
		ip := net.ParseIP(o.nodeIP)
		if ip == nil {
			return fmt.Errorf("--serving-cert=csr needs --node-ip (the apiserver verifies the certificate against the address it dials), got %q", o.nodeIP)
		}
		nodeIPs = []net.IP{ip}
		if o.clientCA == "" {
			if _, err := os.Stat(inClusterCA); err == nil {
				o.clientCA = inClusterCA
			}
		}
	}
	switch {
	case o.queueRoom == -1:
		o.queueRoom = o.maxQueued
	case o.queueRoom < 0 || o.queueRoom > o.maxQueued:
		return fmt.Errorf("--queue-room %d: want 0 to --max-queued (%d), or -1 for --max-queued: more room than the queue holds would fail pods kube-scheduler bound", o.queueRoom, o.maxQueued)
	}
	allowedNamespaces, namespaceSelector, err := poolAccess(o.allowedNamespaces, o.namespaceSelector, o.poolName, log)
	if err != nil {
		return err
	}
	hostUsersNamespaces, err := namespaceList("--host-users-namespaces", o.hostUsersNamespaces)
	if err != nil {
		return err
	}
	if o.podWatch != "assigned" && o.podWatch != "node" {
		return fmt.Errorf("--pod-watch %q: want assigned or node", o.podWatch)
	}
	if n := countSet(o.poolSecretName != "", o.tokenFile != "" || os.Getenv("SANDMAN_POOL_TOKEN") != ""); n > 1 || n == 0 && o.nodeAPICASecret == "" {
		return errors.New("give one of --pool-secret-name, --token-file or SANDMAN_POOL_TOKEN, or --node-api-ca-secret (mutual TLS; the pool secret then only derives sandbox control tokens)")
	}
	// Every listener is bound now, before anything waits (the apiserver,
	// the node agents, a serving certificate): a taken address fails the
	// process at once, naming it. The kubelet port is bound when it is to
	// be served (with TLS) and serves only while this process leads.
	var kubeletL net.Listener
	if serving == servingCSR || o.tlsCert != "" {
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
	restCfg.UserAgent = "sandman-vk/" + o.nodeName
	// Protobuf, as the kubelet and kube-scheduler speak: a pod costs the
	// apiserver and sandman-vk a fraction of JSON's to encode and decode,
	// and the node's pod watch must keep up with every pod on the node
	// (the apiserver gives a watch by node name a buffer of 10 events and
	// closes it when it falls behind).
	restCfg.ContentType = kruntime.ContentTypeProtobuf
	restCfg.AcceptContentTypes = kruntime.ContentTypeProtobuf + "," + kruntime.ContentTypeJSON
	vk.InstrumentRESTConfig(restCfg)
	// Informers notice a returning apiserver within a second, not after
	// client-go's back-off of up to a minute.
	vk.WaitForAPIServer(restCfg, 500*time.Millisecond, 10*time.Minute)
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
	var apiCerts *nodetls.Authority
	if o.nodeAPICASecret != "" {
		ns, name, err := parseSecretName(o.nodeAPICASecret)
		if err != nil {
			return fmt.Errorf("--node-api-ca-secret: %w", err)
		}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		apiCerts, err = watchNodeAPICA(sctx, ctx, client, ns, name, o.poolName, log)
		cancel()
		if err != nil {
			return err
		}
	}
	var token string
	if o.poolSecretName != "" {
		ns, name, err := parseSecretName(o.poolSecretName)
		if err != nil {
			return fmt.Errorf("--pool-secret-name: %w", err)
		}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		token, err = ensurePoolSecret(sctx, client, ns, name)
		cancel()
		if err != nil {
			return err
		}
	} else if apiCerts == nil {
		if token, err = secret(o.tokenFile, "SANDMAN_POOL_TOKEN"); err != nil || token == "" {
			return fmt.Errorf("no pool token: give --token-file, SANDMAN_POOL_TOKEN or --pool-secret-name (%v)", err)
		}
	}

	// The kubelet serving certificate: asked for now, so the request runs
	// while the node agents sync; the kubelet port waits for it below.
	var certs *kubeletcert.Manager
	certCtx, stopCerts := context.WithCancel(ctx)
	defer stopCerts()
	if serving == servingCSR {
		if certs, err = kubeletcert.New(kubeletcert.Config{Client: client, NodeName: o.nodeName, NodeIPs: nodeIPs, Logger: log}); err != nil {
			return err
		}
		wg.Go(func() {
			if err := certs.Run(certCtx); err != nil && certCtx.Err() == nil {
				log.Error("kubelet serving certificate", "err", err)
			}
		})
	}

	// The control keys (controlkey.go), followed while the process runs.
	var controlKeys *vk.ControlKeys
	switch {
	case o.controlKeySecret != "" && o.poolSecretFile != "":
		return errors.New("give one of --control-key-secret and --pool-secret-file")
	case o.controlKeySecret != "":
		ns, name, err := parseSecretName(o.controlKeySecret)
		if err != nil {
			return fmt.Errorf("--control-key-secret: %w", err)
		}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		// Until now the pool token (if any) was the control key: a new
		// Secret keeps it as the previous key, so running sandboxes are
		// re-keyed, not cut off.
		seed := func() ([]byte, error) { return []byte(token), nil }
		if o.controlKeySeedSecret != "" {
			sns, sname, err := parseSecretName(o.controlKeySeedSecret)
			if err != nil {
				cancel()
				return fmt.Errorf("--control-key-seed-secret: %w", err)
			}
			seed = func() ([]byte, error) { return readSeedSecret(sctx, client, sns, sname) }
		}
		current, previous, err := ensureControlKeySecret(sctx, client, ns, name, seed)
		cancel()
		if err != nil {
			return err
		}
		if controlKeys, err = vk.NewControlKeys(current, previous...); err != nil {
			return err
		}
		if err := watchControlKeySecret(ctx, client, ns, name, controlKeys, log); err != nil {
			return err
		}
	case o.poolSecretFile != "":
		current, previous, err := readControlKeyFile(o.poolSecretFile)
		if err != nil {
			return fmt.Errorf("--pool-secret-file: %w", err)
		}
		if controlKeys, err = vk.NewControlKeys(current, previous...); err != nil {
			return err
		}
		wg.Go(func() { watchControlKeyFile(certCtx, o.poolSecretFile, 2*time.Second, controlKeys, log) })
	case token != "":
		if controlKeys, err = vk.NewControlKeys([]byte(token)); err != nil {
			return err
		}
	default:
		log.Warn(errNoControlKey.Error() + ": kubectl exec and logs of authenticated sandboxes, and their idle timeouts, do not work")
	}

	broadcaster := record.NewBroadcaster(record.WithContext(ctx))
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	defer broadcaster.Shutdown()
	recorder := vk.QuietRecorder{EventRecorder: broadcaster.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "sandman-vk", Host: o.nodeName})}

	// Every replica stands by warm: it follows the node agents (the pool's
	// watch streams), syncs the pod, secret, config map and service
	// informers and has its kubelet serving certificate. Only the leader
	// (or the only process, without --leader-elect) runs what writes: the
	// pool's placement and binds, the provider's reconciler, the pod and
	// node controllers (and the kubelet port), the node's owner.
	var provider *vk.Provider
	defer func() {
		if provider != nil {
			provider.Close()
		}
	}()
	// leaderEpoch is sent with every node API call once this process leads
	// (0: no leader election, no epoch).
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
	agentOwner := vk.AgentOwner{Namespace: o.agentNamespace, DaemonSet: o.agentDaemonSet, ServiceAccount: o.agentServiceAccount}
	if apiCerts != nil {
		// Every replica signs: agents get certificates whoever leads (a
		// request decided twice is a conflict, and the second one stops).
		signer, err := vk.NewAgentSigner(vk.AgentSignerConfig{Client: client, CA: apiCerts.Current, Owner: agentOwner, Logger: log})
		if err != nil {
			return err
		}
		go func() {
			if err := signer.Run(ctx); err != nil {
				log.Error("node agent certificate signer", "err", err)
			}
		}()
	}
	connect := func(a vk.Agent) {
		log.Info("node agent", "node", a.Name, "addr", a.Addr)
		var c *nodeapi.Client
		if apiCerts != nil {
			c = nodeapi.NewTLSClient(a.Addr, apiCerts.TLSConfig(a.Name))
		} else {
			c = nodeapi.NewClient(a.Addr, token, nil)
		}
		c.WithLeaderEpoch(leaderEpoch.Load)
		clients.set(a.Name, c)
		pl.AddNode(ctx, a.Name, c)
	}
	if o.agents != "" {
		agents, err := vk.ParseAgents(o.agents)
		if err != nil {
			return fmt.Errorf("--node-agents: %w", err)
		}
		for _, a := range agents {
			connect(a)
		}
	} else if err := vk.DiscoverAgents(ctx, client, agentOwner, o.agentSelector, o.agentPort, log, connect); err != nil {
		return fmt.Errorf("discover node agents: %w", err)
	}
	// Adopt what the node agents hold before the pod controller starts,
	// so no running sandbox is placed twice.
	syncCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
	if err := pl.WaitSynced(syncCtx); err != nil {
		log.Warn("not every node agent answered in time; continuing with those that did", "err", err)
	}
	cancel()
	if certs != nil {
		wctx, cancel := context.WithTimeout(ctx, o.servingCertTimeout)
		err := certs.Wait(wctx)
		cancel()
		if err != nil {
			return fmt.Errorf("--serving-cert=csr: waited %s: %w", o.servingCertTimeout, err)
		}
		log.Info("kubelet serving certificate issued", "vnode", o.nodeName, "expires", certs.Expiry())
	}

	nodeCfg := vk.NodeConfig{Name: o.nodeName, PoolName: o.poolName, IP: o.nodeIP, KubeletPort: kubeletPort(o.kubeletListen), Version: "v1.37.2-sandman",
		QueueRoom: o.queueRoom}
	np := &vk.NodeProvider{Config: nodeCfg, Pool: pl, Nodes: client.CoreV1().Nodes(), Logger: log}
	capa, agents := np.Capacity()
	spec := vk.NodeSpec(nodeCfg, capa, agents)

	mux := http.NewServeMux()
	// Every request on the kubelet port is authenticated and authorized as
	// a kubelet's is (vk/kubeletauth).
	var kubeletHandler http.Handler = mux
	if certs != nil || o.tlsCert != "" {
		auth, err := kubeletAuth(certCtx, &wg, o, client, log)
		if err != nil {
			return err
		}
		kubeletHandler = auth.Handler(mux)
	}
	// The informers virtual-kubelet's pod controller reads, started here
	// (below) so a standby holds them synced; the virtual node's own start
	// of them when it leads finds them running.
	var informers []cache.SharedIndexInformer
	var podInformer cache.SharedIndexInformer
	nodeClient := kubernetes.Interface(client)
	if o.podWatch == "assigned" {
		nodeClient = vk.WidePodWatch(client, o.nodeName)
	}
	// The kubelet port's TLS (nil: the port is not served), set below.
	var kubeletTLS *tls.Config
	opts := []nodeutil.NodeOpt{
		nodeutil.WithClient(nodeClient),
		func(c *nodeutil.NodeConfig) error {
			c.NodeSpec = spec
			c.InformerResyncPeriod = o.resync
			c.NumWorkers = o.workers
			c.EventRecorder = recorder
			// The kubelet port is served in lead, on the listener bound
			// at start: nodeutil, given no handler, serves none itself.
			c.TLSConfig = kubeletTLS
			c.Handler = nil
			return nil
		},
		nodeutil.AttachProviderRoutes(mux),
		nodeutil.WithPodControllerConfigOverrides(func(c *node.PodControllerConfig) error {
			// Tens of thousands of pods are cached: without their
			// managedFields (which nothing here reads) each takes far less.
			if err := c.PodInformer.Informer().SetTransform(vk.TrimPod); err != nil {
				return err
			}
			// Status writes change only the status (vk/statuswrite.go).
			c.PodClient = vk.StatusOnlyPods(c.PodClient, c.PodInformer.Lister())
			podInformer = c.PodInformer.Informer()
			informers = []cache.SharedIndexInformer{podInformer, c.SecretInformer.Informer(),
				c.ConfigMapInformer.Informer(), c.ServiceInformer.Informer()}
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
	switch {
	case certs != nil:
		if kubeletTLS, err = kubeletTLSConfig(kubeletTLSOptions("", "", o.clientCA, certs.GetCertificate)); err != nil {
			return err
		}
	case o.tlsCert != "":
		// Files are watched: a Secret mounted there (say, cert-manager's)
		// renews the certificate without a restart.
		getCert, err := reloadingKeyPair(ctx, &wg, o.tlsCert, o.tlsKey)
		if err != nil {
			return err
		}
		if kubeletTLS, err = kubeletTLSConfig(kubeletTLSOptions("", "", o.clientCA, getCert)); err != nil {
			return err
		}
	default:
		log.Warn("no --tls-cert-file and --serving-cert=file: the kubelet API (kubectl logs/exec) is not served")
	}
	// RuntimeClasses: a pod's runtimeClassName becomes its handler (runc or
	// runsc), as a kubelet resolves it.
	runtimeClasses := kubeinformers.NewSharedInformerFactory(client, o.resync).Node().V1().RuntimeClasses()
	ownInformers := []cache.SharedIndexInformer{runtimeClasses.Informer()}
	// Namespaces: their labels, for --allowed-namespace-selector.
	var namespaces corev1listers.NamespaceLister
	if namespaceSelector != nil {
		nsInformer := kubeinformers.NewSharedInformerFactory(client, o.resync).Core().V1().Namespaces()
		namespaces = nsInformer.Lister()
		ownInformers = append(ownInformers, nsInformer.Informer())
	}
	vnode, err := nodeutil.NewNode(o.nodeName, func(pc nodeutil.ProviderConfig) (nodeutil.Provider, node.NodeProvider, error) {
		provider, err = vk.New(vk.Config{
			NodeName: o.nodeName, Pool: pl, QueueRoom: nodeCfg.QueueRoom, Client: client, Pods: pc.Pods, Secrets: pc.Secrets, Recorder: recorder,
			RuntimeClasses: runtimeClasses.Lister(),
			NodeIP:         o.nodeIP, AllowUnauthenticated: o.allowUnauthenticated, ControlKeys: controlKeys,
			ReconcileInterval: o.reconcile, OrphanGrace: o.orphanGrace, Logger: log, SelfUsage: selfUsage,
			DefaultLimits: o.defaultLimits.l, MaxLimits: o.maxLimits.l, PidsLimit: o.pidsLimit,
			AllowedNamespaces: allowedNamespaces, AllowedNamespaceSelector: namespaceSelector, Namespaces: namespaces,
			HostUsersNamespaces: hostUsersNamespaces,
			DefaultBandwidth:    o.defaultBandwidth.b, MaxBandwidth: o.maxBandwidth.b,
			SeccompLocalhostProfiles: commaList(o.seccompProfiles),
		})
		return provider, np, err
	}, opts...)
	if err != nil {
		return err
	}
	// sandman's own routes (images, pre-pull) beside the kubelet API.
	provider.AttachAPI(mux)
	// A deleted pod's slot is released when the informer sees the
	// deletion, not when virtual-kubelet's sync queue gets to it.
	if _, err := podInformer.AddEventHandler(provider.DeletionHandler()); err != nil {
		return err
	}
	if err := syncInformers(ctx, append(informers, ownInformers...)); err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(pool.Collectors()...)
	reg.MustRegister(vk.Collectors()...)
	reg.MustRegister(kubeletauth.Collectors()...)
	reg.MustRegister(pl.Collector(), provider.Collector())
	metrics := http.NewServeMux()
	metrics.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	provider.AttachCapacity(metrics)
	if o.pprof {
		metrics.HandleFunc("/debug/pprof/", pprof.Index)
		metrics.HandleFunc("/debug/pprof/profile", pprof.Profile)
		metrics.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		metrics.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	metrics.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	msrv := &http.Server{Handler: metrics, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = msrv.Serve(ml) }()
	defer msrv.Close()

	// lead runs what only the leader runs until ctx ends (a signal, a lost
	// Lease) or one part fails: then the others stop too, and lead returns
	// the first error once they have.
	lead := func(ctx context.Context, epoch uint64) error {
		leaderEpoch.Store(epoch)
		if epoch > 0 {
			// From here on the agents refuse the previous leader.
			if err := clients.claim(ctx, log); err != nil {
				return fmt.Errorf("a newer leader has claimed the node agents: %w", err)
			}
			// The binds the previous leader left running end (bound: adopted
			// below; or not: placed anew), so none is bound twice.
			sctx, cancel := context.WithTimeout(ctx, takeoverSettle)
			if err := pl.WaitBindsSettled(sctx, 100*time.Millisecond); err != nil {
				log.Warn("the previous leader's binds have not all ended; adopting what is bound or binding now", "err", err)
			}
			cancel()
		}
		if err := provider.Adopt(ctx); err != nil {
			return fmt.Errorf("adopt running sandboxes: %w", err)
		}
		g, ctx := errgroup.WithContext(ctx)
		g.Go(func() error {
			if err := pl.Run(ctx); err != nil {
				return fmt.Errorf("pool: %w", err)
			}
			return nil
		})
		g.Go(func() error {
			if err := provider.Run(ctx); err != nil {
				return fmt.Errorf("provider: %w", err)
			}
			return nil
		})
		if o.ownerNamespace != "" {
			g.Go(func() error {
				ownNode(ctx, client, o.nodeName, o.ownerNamespace, log)
				return nil
			})
		}
		log.Info("virtual node starting", "vnode", o.nodeName, "pool", o.poolName, "agents", pl.NodeNames(), "ip", o.nodeIP, "epoch", epoch)
		if kubeletL != nil && kubeletTLS != nil {
			// As nodeutil would serve it, on the listener bound at start.
			srv := &http.Server{Handler: kubeletHandler, TLSConfig: kubeletTLS, ReadHeaderTimeout: 30 * time.Second}
			g.Go(func() error {
				if err := srv.Serve(tls.NewListener(kubeletL, kubeletTLS)); !errors.Is(err, http.ErrServerClosed) {
					return fmt.Errorf("kubelet API on %s: %w", kubeletL.Addr(), err)
				}
				return nil
			})
			g.Go(func() error {
				<-ctx.Done()
				_ = srv.Close()
				return nil
			})
		}
		g.Go(func() error {
			err := vnode.Run(ctx)
			if errors.Is(err, context.Canceled) {
				return nil // stopped: by a signal, a lost Lease, or another part's failure
			}
			if err != nil {
				return fmt.Errorf("virtual node: %w", err)
			}
			return nil
		})
		return g.Wait()
	}
	if !o.leaderElect {
		return lead(ctx, 0)
	}
	if o.nodeIP == "" {
		log.Warn("--leader-elect without --node-ip or POD_IP: the node's address does not follow the leader, so kubectl exec and logs reach no replica")
	}
	ns, err := leaseNamespace(o.leaderElectNamespace, os.Getenv("POD_NAMESPACE"))
	if err != nil {
		return err
	}
	return election{
		Client: client, Namespace: ns, Name: "sandman-vk-" + o.nodeName, Identity: leaseIdentity(os.Getenv("POD_NAME")),
		LeaseDuration: o.leaseDuration, RenewDeadline: o.renewDeadline, RetryPeriod: o.retryPeriod, Logger: log,
	}.run(ctx, lead)
}

// takeoverSettle bounds how long a new leader waits for the binds its
// predecessor left running (cancelled when it stopped or died, so they
// end within moments; a cold pull inside one may take longer).
const takeoverSettle = 30 * time.Second

// syncInformers starts informers and waits until they have synced (or ctx
// ends); they run until ctx ends.
func syncInformers(ctx context.Context, informers []cache.SharedIndexInformer) error {
	synced := make([]cache.InformerSynced, 0, len(informers))
	for _, inf := range informers {
		go inf.Run(ctx.Done())
		synced = append(synced, inf.HasSynced)
	}
	if !cache.WaitForCacheSync(ctx.Done(), synced...) {
		return fmt.Errorf("pod, secret, config map, service, RuntimeClass and namespace informers: %w", context.Cause(ctx))
	}
	return nil
}

// listen binds addr for the listener flag names, or says which flag and
// address could not be bound and why.
func listen(flag, addr string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%s=%s: %w", flag, addr, err)
	}
	return l, nil
}

// kubeletTLSConfig is the kubelet port's TLS configuration as
// nodeutil.WithTLSConfig makes it (its ciphers and minimum version) with
// opts applied.
func kubeletTLSConfig(opts []func(*tls.Config) error) (*tls.Config, error) {
	var c nodeutil.NodeConfig
	if err := nodeutil.WithTLSConfig(opts...)(&c); err != nil {
		return nil, fmt.Errorf("kubelet TLS: %w", err)
	}
	return c.TLSConfig, nil
}

// inClusterCA is the cluster CA as every pod sees it.
const inClusterCA = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"

// Where the kubelet serving certificate comes from.
const (
	servingFile = "file"
	servingCSR  = "csr"
)

// servingMode resolves --serving-cert: csr in a cluster unless certificate
// files are given, files otherwise (the local stack's host processes).
func servingMode(o options) (string, error) {
	switch o.servingCert {
	case "":
		if o.tlsCert == "" && o.kubeconfig == "" {
			return servingCSR, nil
		}
		return servingFile, nil
	case servingFile:
		return servingFile, nil
	case servingCSR:
		if o.tlsCert != "" {
			return "", errors.New("--serving-cert=csr and --tls-cert-file exclude each other")
		}
		return servingCSR, nil
	}
	return "", fmt.Errorf("--serving-cert: %q is neither file nor csr", o.servingCert)
}

// reloadingKeyPair serves the key pair in certFile and keyFile, read again
// whenever either changes (a mounted Secret is updated in place) until ctx
// ends; wg waits for the watch.
func reloadingKeyPair(ctx context.Context, wg *sync.WaitGroup, certFile, keyFile string) (func(*tls.ClientHelloInfo) (*tls.Certificate, error), error) {
	if keyFile == "" {
		return nil, errors.New("--tls-cert-file needs --tls-key-file")
	}
	kp, err := dynamiccertificates.NewDynamicServingContentFromFiles("kubelet-serving", certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert-file, --tls-key-file: %w", err)
	}
	wg.Go(func() { kp.Run(ctx, 1) })
	var mu sync.Mutex
	var lastCert []byte
	var last *tls.Certificate
	return func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
		certPEM, keyPEM := kp.CurrentCertKeyContent()
		mu.Lock()
		defer mu.Unlock()
		if last != nil && bytes.Equal(certPEM, lastCert) {
			return last, nil
		}
		pair, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("kubelet serving certificate %s: %w", certFile, err)
		}
		lastCert, last = certPEM, &pair
		return last, nil
	}, nil
}

// kubeletTLSOptions configures the kubelet port's TLS: the serving
// certificate from getCert (asked at every handshake, so a renewed one is
// used without a restart) or else from files; with a client CA, client
// certificates are asked for (naming the CA) but not required, as a kubelet
// does: a client may bring a bearer token instead, and kubeletauth verifies
// whichever it brings. Without one, none is asked for.
func kubeletTLSOptions(certFile, keyFile, clientCA string, getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error)) []func(*tls.Config) error {
	var opts []func(*tls.Config) error
	if getCert != nil {
		opts = append(opts, func(c *tls.Config) error {
			c.GetCertificate = getCert
			return nil
		})
	} else {
		opts = append(opts, nodeutil.WithKeyPairFromPath(certFile, keyFile))
	}
	if clientCA == "" {
		return append(opts, func(c *tls.Config) error {
			c.ClientAuth = tls.NoClientCert
			return nil
		})
	}
	return append(opts, func(c *tls.Config) error {
		pem, err := os.ReadFile(clientCA)
		if err != nil {
			return fmt.Errorf("--client-ca-file: %w", err)
		}
		c.ClientAuth = tls.RequestClientCert
		return nodeutil.WithCACert(pem)(c)
	})
}

// kubeletAuth builds what guards the kubelet port from the flags; the
// client CA file is watched for changes until ctx ends (wg waits for it).
func kubeletAuth(ctx context.Context, wg *sync.WaitGroup, o options, client kubernetes.Interface, log *slog.Logger) (*kubeletauth.Auth, error) {
	cfg := kubeletauth.Config{
		NodeName: o.nodeName, Client: client, TokenWebhook: o.tokenWebhook, Anonymous: o.anonymousAuth,
		Mode: kubeletauth.Mode(o.authorizationMode), TokenCacheTTL: o.tokenCacheTTL, AllowCacheTTL: o.allowTTL, DenyCacheTTL: o.denyTTL,
		Logger: log.With("subsystem", "kubelet-auth"),
	}
	if o.clientCA != "" {
		ca, err := dynamiccertificates.NewDynamicCAContentFromFile("client-ca-bundle", o.clientCA)
		if err != nil {
			return nil, fmt.Errorf("--client-ca-file: %w", err)
		}
		wg.Go(func() { ca.Run(ctx, 1) })
		cfg.ClientCA = ca
	}
	auth, err := kubeletauth.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubelet API: %w", err)
	}
	log.Info("kubelet API clients", "client-ca", o.clientCA, "token-review", o.tokenWebhook, "anonymous", o.anonymousAuth, "authorization", o.authorizationMode)
	if o.clientCA == "" {
		log.Warn("no --client-ca-file: client certificates authenticate no one on the kubelet API, the apiserver's own included, " +
			"so kubectl exec/logs through the apiserver get 401; only bearer tokens get in")
	}
	if cfg.Mode == kubeletauth.ModeAlwaysAllow {
		log.Warn("--authorization-mode=AlwaysAllow: whoever authenticates to the kubelet API may exec into every sandbox (tests and local experiments only)", "anonymous", o.anonymousAuth)
	}
	return auth, nil
}

func retryAlways(ctx context.Context, key string, timesTried int, originallyAdded time.Time, err error) (*time.Duration, error) {
	d := min(time.Duration(timesTried)*100*time.Millisecond, 10*time.Second)
	return &d, nil
}

func kubeletPort(listen string) int32 {
	_, p, err := net.SplitHostPort(listen)
	if err != nil {
		return 10250
	}
	var n int32
	_, _ = fmt.Sscan(p, &n)
	return n
}

// secret reads a file's trimmed content, or an environment variable when
// no file is given.
func secret(file, env string) (string, error) {
	if file == "" {
		return os.Getenv(env), nil
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// countSet counts the true values.
func countSet(b ...bool) int {
	n := 0
	for _, v := range b {
		if v {
			n++
		}
	}
	return n
}

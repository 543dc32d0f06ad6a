package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/sandman-dev/sandman/vk"
	"github.com/sandman-dev/sandman/vk/kubeletauth"
)

// options are sandman-vk's flags; validate fills in the defaults that
// depend on others and the environment.
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
	autoPauseAfter                         time.Duration
	movePausedAfter                        time.Duration
	keepPaused                             time.Duration
	usageInterval                          time.Duration
	usageRate                              float64
	metricsListen, logLevel                string
	podWatch                               string
	defaultLimits, maxLimits               resourceList
	defaultBandwidth, maxBandwidth         bandwidth
	pidsLimit                              int64
	allowedNamespaces, namespaceSelector   string
	hostUsersNamespaces                    string
	privilegeEscalationNamespaces          string
	seccompProfiles                        string
	leaderElect                            bool
	leaderElectNamespace                   string
	leaseDuration, renewDeadline           time.Duration
	retryPeriod                            time.Duration
	printVersion                           bool

	// Set by validate.
	level   slog.Level
	serving string   // servingFile or servingCSR
	nodeIPs []net.IP // the serving certificate's, with servingCSR
}

// bindFlags defines the flags on fs, writing into o.
func (o *options) bindFlags(fs *flag.FlagSet) {
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
	fs.DurationVar(&o.keepPaused, "keep-paused", vk.DefaultKeepPaused, "how long a sandbox paused at its expiry (annotation sandman.io/on-expiry: pause) is kept paused before it is deleted")
	fs.DurationVar(&o.movePausedAfter, "move-paused-after", 0, "move sandboxes paused this long off their worker (the node agents need --checkpoint-repository): they then hold no slot, and resume on any worker at a new address (0: off)")
	fs.DurationVar(&o.autoPauseAfter, "auto-pause-after", 0, "pause gVisor sandboxes idle this long (checked every --reconcile-interval); the next kubectl exec or E2B call resumes them (0: off)")
	fs.DurationVar(&o.usageInterval, "usage-interval", 5*time.Second, "how often each running sandbox's resource use is sampled for the E2B gateway's metrics (GET /sandman/v1/usage; 2 KiB a sandbox at most; negative: never)")
	fs.Float64Var(&o.usageRate, "usage-rate", 500, "the most sandbox resource readings a second the sampling makes (more sandboxes are each read less often)")
	fs.DurationVar(&o.orphanGrace, "orphan-grace", 30*time.Second, "how long a slot whose pod is gone is kept before release")
	fs.DurationVar(&o.lost, "lost-after", 2*time.Minute, "how long a node agent may be unreachable before its running pods are failed as lost")
	fs.StringVar(&o.metricsListen, "metrics-listen", "127.0.0.1:9652", "Prometheus /metrics and /healthz address")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&o.printVersion, "version", false, "print the version and exit")
	o.defaultLimits, o.maxLimits = mustResourceList(defaultLimits), mustResourceList(maxLimits)
	fs.Var(&o.defaultLimits, "default-limits", "limits of a sandbox container that sets none: cpu, memory, ephemeral-storage (a larger request is the limit instead; empty: none)")
	fs.Var(&o.maxLimits, "max-limits", "largest request or limit a sandbox container may ask for: cpu, memory, ephemeral-storage (pods above are refused; empty: no maximum)")
	fs.StringVar(&o.allowedNamespaces, "allowed-namespaces", "", "namespaces whose pods may use this pool, comma-separated (with --allowed-namespace-selector: either admits); "+
		"a pod of any other fails NamespaceNotAllowed, however it reached the node (spec.nodeName included). Neither flag: every namespace (a warning at start)")
	fs.StringVar(&o.namespaceSelector, "allowed-namespace-selector", "", "label selector of the namespaces whose pods may use this pool (team=ml; RBAC: list/watch namespaces); see --allowed-namespaces")
	fs.StringVar(&o.hostUsersNamespaces, "host-users-namespaces", "", "namespaces whose pods may set hostUsers: true, the opt-out of the sandbox's user namespace "+
		"(root in the sandbox is then root on the worker, capabilities cut), comma-separated; any other's fail InvalidSpec. Empty: no pod may "+
		"(a node agent with --user-namespaces=required refuses them all anyway)")
	fs.StringVar(&o.privilegeEscalationNamespaces, "privilege-escalation-namespaces", "", "namespaces whose pods may set a container's "+
		"allowPrivilegeEscalation: true, which runs it without no_new_privs so setuid programs (sudo, as in E2B's base template) work; root so "+
		"reached is the sandbox's own (capabilities, seccomp and user namespace unchanged), comma-separated; any other's fail InvalidSpec. Empty: no pod may")
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
}

// validate checks the flags against each other and fills in what they
// leave to defaults: the node name, the node IP (env POD_IP), the serving
// certificate mode, the client CA with --serving-cert=csr, the queue room.
func (o *options) validate() error {
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
	if err := o.level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	var err error
	if o.serving, err = servingMode(*o); err != nil {
		return err
	}
	if o.serving == servingCSR {
		ip := net.ParseIP(o.nodeIP)
		if ip == nil {
			return fmt.Errorf("--serving-cert=csr needs --node-ip (the apiserver verifies the certificate against the address it dials), got %q", o.nodeIP)
		}
		o.nodeIPs = []net.IP{ip}
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
	if o.podWatch != string(vk.PodWatchAssigned) && o.podWatch != string(vk.PodWatchNode) {
		return fmt.Errorf("--pod-watch %q: want assigned or node", o.podWatch)
	}
	if n := countSet(o.poolSecretName != "", o.tokenFile != "" || os.Getenv("SANDMAN_POOL_TOKEN") != ""); n > 1 || n == 0 && o.nodeAPICASecret == "" {
		return errors.New("give one of --pool-secret-name, --token-file or SANDMAN_POOL_TOKEN, or --node-api-ca-secret (mutual TLS; the pool secret then only derives sandbox control tokens)")
	}
	if o.controlKeySecret != "" && o.poolSecretFile != "" {
		return errors.New("give one of --control-key-secret and --pool-secret-file")
	}
	return nil
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

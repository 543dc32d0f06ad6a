// Command sandman-node is the node agent: it keeps pre-warmed containerd
// slots on one worker and serves the node API (runtime/nodeapi) that the
// virtual node drives, with Prometheus metrics on /metrics.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	clog "github.com/containerd/log"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"

	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/hostexec"
	"github.com/sandman-dev/sandman/runtime/netpolicy"
	"github.com/sandman-dev/sandman/runtime/nodeapi"
	"github.com/sandman-dev/sandman/runtime/nodeapi/nodetls"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/sandboxdns"
	"github.com/sandman-dev/sandman/runtime/sandboxnet"
)

type options struct {
	node, containerdAddress, namespace          string
	slots, warmSlots                            int
	stateDir, daemonPath, cniConfDir, cniBinDir string
	listen, tokenFile, cpu, memory, logLevel    string
	nodeAPITLS                                  bool
	guardCIDR, imageCache, hostsDir             string
	hostRoot, daemonSource, uninstallWhenGone   string
	kubeconfig                                  string
	drainWhenCordoned                           bool
	statusFile                                  string
	prePull                                     []string
	prePullConcurrency                          int
	pidsLimit                                   int64
	shimGroupSize                               int
	seccompRoot                                 string
	egress, egressAllow, egressDeny             string
	dnsListen, dnsUpstream                      string
	noFirewall, networkPolicies                 bool
	diskInodes                                  int64
	controlNamespaces                           string
	runc, runcSource, userNS                    string
	runsc, runscSource, runscPlatform           string
	userNSBase                                  uint
	snapshotRegistry, snapshotPushConfig        string
	snapshotScratchDir                          string
	snapshotRepositories                        []string
	hotSlots                                    string
	hotBudget                                   int
	hotImages                                   []string
	hotMixWindow                                int
	hotMixHalfLife                              time.Duration
	stopTimeout                                 time.Duration
}

func main() {
	// Through a shim, this binary stands for one of the host's CNI plugins
	// or its iptables (pod mode, --host-root): that runs here and never returns.
	hostexec.Main()
	if len(os.Args) == 3 && os.Args[1] == "probe" {
		os.Exit(probe(os.Args[2]))
	}
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "sandman-node: %v\n", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	host, _ := os.Hostname()
	var o options
	fs := flag.NewFlagSet("sandman-node", flag.ContinueOnError)
	fs.StringVar(&o.node, "node", host, "this worker's name")
	fs.StringVar(&o.containerdAddress, "containerd-address", "/run/containerd/containerd.sock", "containerd socket")
	fs.StringVar(&o.namespace, "namespace", "sandman", "containerd namespace")
	fs.IntVar(&o.slots, "slots", 16, "slot capacity")
	fs.IntVar(&o.warmSlots, "warm-slots", 4, "slots kept warm ahead of binds")
	fs.StringVar(&o.stateDir, "state-dir", "/var/lib/sandman-node", "slot state and network namespaces")
	fs.StringVar(&o.daemonPath, "daemon-path", "/usr/local/lib/sandman/sandman-daemon", "host path of the static sandman-daemon that sandboxes mount")
	fs.StringVar(&o.daemonSource, "daemon-source", "", "copy this sandman-daemon (the one in the agent's image) to --daemon-path at start (pod mode)")
	fs.StringVar(&o.runc, "runc", "", "host path of the runc that runs sandboxes (>= 1.2 for user namespaces; hack/build-tools.sh builds the pinned one); default: the runc containerd's shim finds")
	fs.StringVar(&o.runcSource, "runc-source", "", "copy this runc (the one in the agent's image) to --runc at start (pod mode; the shim runs it on the host)")
	fs.StringVar(&o.runsc, "runsc", "", "host path of gVisor's runsc: pods whose RuntimeClass handler is runsc run under it (hack/build-tools.sh builds the pinned one); empty: such pods are refused")
	fs.StringVar(&o.runscSource, "runsc-source", "", "copy this runsc (the one in the agent's image) to --runsc at start (pod mode; the shim runs it on the host)")
	fs.StringVar(&o.runscPlatform, "runsc-platform", "systrap", "gVisor's platform: systrap, ptrace or kvm (needs /dev/kvm)")
	fs.StringVar(&o.userNS, "user-namespaces", "on", "on: sandboxes run in a user namespace, root in one an unprivileged uid of the node (a pod's hostUsers: true opts out); required: hostUsers: true is refused; off: only pods with hostUsers: false get one. Needs runc >= 1.2 (--runc) and Linux >= 5.19")
	fs.UintVar(&o.userNSBase, "user-namespace-base", 1<<31, "first host uid/gid of sandboxes' user namespaces: slot n maps 0-65535 inside to base+n*65536 onwards; keep it apart from other subordinate id ranges of the node (/etc/subuid, a kubelet's user-namespaced pods)")
	fs.StringVar(&o.hostRoot, "host-root", "", "where the host's root is mounted when the agent runs in a pod: CNI plugins (--cni-bin-dir, a host path) and iptables run from there")
	fs.StringVar(&o.cniConfDir, "cni-conf-dir", "/etc/cni/net.d", "CNI configuration directory")
	fs.StringVar(&o.cniBinDir, "cni-bin-dir", "/opt/cni/bin", "CNI plugin directory")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:9651", "node API and /metrics address (keep it unreachable from sandboxes)")
	fs.StringVar(&o.guardCIDR, "guard-from", "", "comma-separated CIDRs (the slot or cluster pod networks) whose addresses are rejected at the node API port (iptables); needed when --listen is reachable from sandboxes")
	fs.StringVar(&o.tokenFile, "token-file", "", "file with the pool secret callers must present (or env SANDMAN_POOL_TOKEN); the host-process stack's plain-HTTP node API")
	fs.BoolVar(&o.nodeAPITLS, "node-api-tls", false, "serve the node API over mutual TLS instead of a pool secret: the agent's certificate comes from a CSR for signer "+
		nodetls.SignerName+" made with the pod's ServiceAccount (sandman-vk checks and signs it), callers must present the control plane's certificate from the same CA; "+
		"--listen must name the node's IP")
	fs.StringVar(&o.cpu, "cpu", "", "CPU sandboxes may request in total, e.g. 8 (default: all cores)")
	fs.StringVar(&o.memory, "memory", "", "memory sandboxes may request in total, e.g. 16Gi (default: all memory)")
	fs.Int64Var(&o.pidsLimit, "pids-limit", 1024, "processes per sandbox container (a pod's lower limit from its pool applies instead)")
	fs.IntVar(&o.shimGroupSize, "shim-group-size", noderuntime.DefaultShimGroupSize, "slots sharing one runc shim, each group kept alive by a holder container (16: ~2.7 MB of host memory per idle sandbox; 1: a shim per sandbox, no holders, ~6.4 MB, no shared fate)")
	fs.StringVar(&o.seccompRoot, "seccomp-profile-root", "/var/lib/kubelet/seccomp", "directory of the seccomp profiles pods name with seccompProfile Localhost, as the kubelet's (in a pod: under --host-root)")
	fs.StringVar(&o.imageCache, "image-cache-bytes", "", "disk budget for images, e.g. 50Gi; least recently used images no slot uses are removed above it (default: no budget)")
	fs.StringVar(&o.snapshotRegistry, "snapshot-registry", "", "registry (host[:port][/path-prefix]) that snapshots of sandboxes are pushed to; a snapshot named repository:tag goes under it, a full name must be in it (empty: the node takes no snapshots)")
	fs.StringVar(&o.snapshotPushConfig, "snapshot-push-config", "", "docker config JSON file with the credentials to push snapshots to --snapshot-registry, read at every snapshot (empty: anonymous pushes)")
	fs.Func("snapshot-repository", "host[:port][/prefix] under which snapshots are kept by namespace, <prefix>/<namespace>/<name>:<tag> (the gateway's: <--snapshot-registry>/e2b, its --snapshot-repository); repeatable, or comma-separated. A pod may not start another namespace's snapshot, and a pod's snapshot must go under <prefix>/<its namespace>/ (default none: any pod may start any snapshot the registry serves)", func(v string) error {
		for repo := range strings.SplitSeq(v, ",") {
			if repo = strings.TrimSpace(repo); repo != "" {
				o.snapshotRepositories = append(o.snapshotRepositories, repo)
			}
		}
		return nil
	})
	fs.StringVar(&o.snapshotScratchDir, "snapshot-scratch-dir", "", "where a snapshot's uncompressed changes are written while the sandbox is frozen, then compressed (default <state-dir>/snapshots)")
	fs.StringVar(&o.hostsDir, "registry-hosts-dir", "", "per-registry settings in containerd's hosts.toml layout (<dir>/<host>/hosts.toml: mirrors, plain HTTP, CA, skip_verify)")
	fs.Func("prepull", "image kept unpacked on this node (repeatable, or comma-separated)", func(v string) error {
		for ref := range strings.SplitSeq(v, ",") {
			if ref = strings.TrimSpace(ref); ref != "" {
				o.prePull = append(o.prePull, ref)
			}
		}
		return nil
	})
	fs.IntVar(&o.prePullConcurrency, "prepull-concurrency", 1, "pre-pulls in flight at once (binds never wait behind them)")
	fs.StringVar(&o.hotSlots, "hot-slots", "auto", "slots that may hold a started sandbox of an image binds use, its daemon waiting for a pod (a bind takes ~4 ms instead of ~90-250 ms; ~10 MB of host memory each): a count, 0 for none, or auto (as many as --warm-slots). Images get them in proportion to the recent binds (--hot-mix-window); those no longer bound are cooled down")
	fs.Func("hot-images", "image kept hot whatever the binds (repeatable, or comma-separated): one hot slot each, and what the bind mix leaves of --hot-slots", func(v string) error {
		for ref := range strings.SplitSeq(v, ",") {
			if ref = strings.TrimSpace(ref); ref != "" {
				o.hotImages = append(o.hotImages, ref)
			}
		}
		return nil
	})
	fs.IntVar(&o.hotMixWindow, "hot-mix-window", 100, "how many recent binds decide which images are kept hot, and how many of each")
	fs.DurationVar(&o.hotMixHalfLife, "hot-mix-half-life", 5*time.Minute, "how fast a bind's weight in the mix fades, so an image no longer bound is cooled down even on a quiet node (one bound n times leaves the mix after about log2(2n) half-lives)")
	fs.BoolVar(&o.drainWhenCordoned, "drain-when-cordoned", false, "drain while this worker's Node (--node) is cordoned (kubectl cordon/drain): refuse binds, evict and release every sandbox with a message, tear idle slots down; take binds again when uncordoned (needs in-cluster credentials or --kubeconfig, and get/list/watch on nodes)")
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig for --drain-when-cordoned outside a cluster (default: in-cluster credentials)")
	fs.StringVar(&o.uninstallWhenGone, "uninstall-when-gone", "", "NAMESPACE/DAEMONSET: on SIGTERM, if that DaemonSet or its namespace is gone or being deleted (an uninstall, not a rolling update), release every sandbox and remove everything of sandman's from this worker (needs in-cluster credentials)")
	fs.StringVar(&o.statusFile, "status-file", "", "write why the agent is not serving (or \"ok\") here; `sandman-node probe FILE` reads it (an exec readiness probe whose message lands in the pod's events)")
	fs.StringVar(&o.egress, "sandbox-egress", "none", "what sandboxes reach beyond --sandbox-egress-allow: none, or internet (public addresses; pods may narrow it with sandman.io/egress). "+
		"Private, link-local and reserved ranges and this node's addresses stay unreachable either way")
	fs.StringVar(&o.egressAllow, "sandbox-egress-allow", "", "comma-separated CIDRs sandboxes reach whatever else says (a proxy, a DNS server, a package mirror)")
	fs.StringVar(&o.egressDeny, "sandbox-egress-deny", "", "comma-separated CIDRs sandboxes never reach, besides the private and special ranges (e.g. public addresses of the cluster's own services)")
	fs.StringVar(&o.dnsListen, "dns-listen", ":0", "UDP and TCP address of the node's DNS resolver for sandboxes whose pods allow names (sandman.io/egress-domains): their DNS is sent to it, it answers only those names and opens the firewall to what they resolve to. "+
		"Port 0: one the kernel picks; empty: no resolver, and such pods are refused. Sandboxes reach it through the node's address on the slot network; other addresses are refused")
	fs.StringVar(&o.dnsUpstream, "dns-upstream", "", "comma-separated DNS servers (host:port, or an address for port 53) the sandbox resolver forwards allowed names to (default: the nameservers of the node's /etc/resolv.conf)")
	fs.BoolVar(&o.noFirewall, "no-sandbox-firewall", false, "UNSAFE: no rules in slot network namespaces, so sandboxes reach everything this node can (other sandboxes, the node, the cluster, metadata); for kernels without nf_tables")
	fs.Int64Var(&o.diskInodes, "disk-inodes", 1<<20, "files and directories a sandbox container may make in its writable layer; over it the sandbox is stopped (Evicted), as over its ephemeral-storage limit")
	fs.BoolVar(&o.networkPolicies, "network-policies", false, "enforce the NetworkPolicies that select sandbox pods on their slots, and let only the pod's own namespace and --control-namespaces reach a sandbox by default "+
		"(needs in-cluster credentials or --kubeconfig, and list/watch on pods, namespaces and networkpolicies)")
	fs.StringVar(&o.controlNamespaces, "control-namespaces", "sandman-system", "comma-separated namespaces whose pods (sandman-vk, the gateway) always reach sandbox daemons, whatever a policy says")
	fs.DurationVar(&o.stopTimeout, "stop-timeout", 25*time.Second, "how long a stopping agent (SIGTERM) has to finish releases under way and tear its warm and hot slots down; keep it a few seconds under the pod's terminationGracePeriodSeconds. What is not removed by then, the next agent's recovery removes (about 9 s for 110 slots on 2 busy cores)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.stopTimeout <= 0 {
		return fmt.Errorf("--stop-timeout %v: want a positive duration such as 25s", o.stopTimeout)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("component", "node")
	// client-go (the uninstall watch's informers) logs through klog.
	klog.SetSlogLogger(log)
	// containerd's client logs each registry request at info; its failures
	// reach our log with the pull's error.
	if level > slog.LevelDebug {
		_ = clog.SetLevel("warn")
	}
	token := os.Getenv("SANDMAN_POOL_TOKEN")
	if o.tokenFile != "" {
		b, err := os.ReadFile(o.tokenFile)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	switch {
	case o.nodeAPITLS && token != "":
		return errors.New("give --node-api-tls or a pool secret (--token-file, SANDMAN_POOL_TOKEN), not both")
	case !o.nodeAPITLS && token == "":
		return errors.New("no node API credentials: give --node-api-tls (in a cluster), or --token-file or SANDMAN_POOL_TOKEN")
	}
	var res runtime.Resources
	if o.cpu != "" {
		q, err := resource.ParseQuantity(o.cpu)
		if err != nil {
			return fmt.Errorf("--cpu %q: %w", o.cpu, err)
		}
		res.MilliCPU = q.MilliValue()
	}
	if o.memory != "" {
		q, err := resource.ParseQuantity(o.memory)
		if err != nil {
			return fmt.Errorf("--memory %q: %w", o.memory, err)
		}
		res.MemoryBytes = q.Value()
	}

	var cacheBytes int64
	if o.imageCache != "" {
		q, err := resource.ParseQuantity(o.imageCache)
		if err != nil || q.Value() < 0 {
			return fmt.Errorf("--image-cache-bytes %q: want a size such as 50Gi", o.imageCache)
		}
		cacheBytes = q.Value()
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	cniBinDir := o.cniBinDir
	if o.hostRoot != "" {
		dir, err := hostexec.Setup(hostexec.Config{HostRoot: o.hostRoot, CNIBinDir: o.cniBinDir, ShimDir: filepath.Join(os.TempDir(), "sandman-hostexec")})
		if err != nil {
			return err
		}
		cniBinDir = dir
	}
	if o.daemonSource != "" {
		if err := installBinary(o.daemonSource, o.daemonPath); err != nil {
			return fmt.Errorf("--daemon-source, --daemon-path: %w", err)
		}
	}
	if o.runcSource != "" {
		if o.runc == "" {
			return errors.New("--runc-source needs --runc, the host path to copy it to")
		}
		if err := installBinary(o.runcSource, o.runc); err != nil {
			return fmt.Errorf("--runc-source, --runc: %w", err)
		}
	}
	if o.runscSource != "" {
		if o.runsc == "" {
			return errors.New("--runsc-source needs --runsc, the host path to copy it to")
		}
		if err := installBinary(o.runscSource, o.runsc); err != nil {
			return fmt.Errorf("--runsc-source, --runsc: %w", err)
		}
	}
	var err error
	if o.hotBudget, err = hotBudget(o.hotSlots, o.slots, o.warmSlots); err != nil {
		return err
	}
	if o.userNSBase > 1<<32-1 {
		return fmt.Errorf("--user-namespace-base %d: want a uid below 2^32", o.userNSBase)
	}
	var uw *uninstallWatch
	if o.uninstallWhenGone != "" {
		var err error
		if uw, err = watchUninstall(ctx, o.uninstallWhenGone, log); err != nil {
			return err
		}
	}

	// The listener comes first, so a readiness probe and the virtual node
	// hear why the agent is not serving (containerd unreachable, no CNI
	// config yet) while it keeps trying.
	l, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	var apiCerts *nodetls.AgentCerts
	if o.nodeAPITLS {
		if apiCerts, err = agentCerts(o, log); err != nil {
			return err
		}
		apiCerts.Start()
		defer apiCerts.Stop()
		l = tls.NewListener(l, apiCerts.TLSConfig())
	}
	for cidr := range strings.SplitSeq(o.guardCIDR, ",") {
		if cidr = strings.TrimSpace(cidr); cidr == "" {
			continue
		}
		unguard, err := noderuntime.GuardPort(cidr, l.Addr().(*net.TCPAddr).Port)
		if err != nil {
			return err
		}
		defer func() {
			if err := unguard(); err != nil {
				log.Error("remove the node API guard", "err", err)
			}
		}()
	}
	var handler atomic.Pointer[http.Handler]
	var notReady atomic.Value
	setStatus := func(msg string) {
		notReady.Store(msg)
		if o.statusFile != "" {
			if err := os.WriteFile(o.statusFile, []byte(msg+"\n"), 0o644); err != nil {
				log.Error("status file", "err", err)
			}
		}
	}
	setStatus("starting")
	waiting := nodeapi.NotServing(func() string { return fmt.Sprintf("node agent %s not serving: %s", o.node, notReady.Load()) })
	handler.Store(&waiting)
	hs := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { (*handler.Load()).ServeHTTP(w, r) }), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	served := make(chan error, 1)
	go func() { served <- hs.Serve(l) }()
	log.Info("listening", "listen", o.listen, "node", o.node)

	var client *ctrd.Client
	var rt *noderuntime.Runtime
	// The policy engine is made first (the runtime asks it at every bind)
	// and refreshes the runtime's firewalls once that exists.
	var policies noderuntime.PolicySource
	var refresh atomic.Pointer[noderuntime.Runtime]
	if o.networkPolicies {
		kc, err := kubeClient(o.kubeconfig)
		if err != nil {
			return fmt.Errorf("--network-policies: %w", err)
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
			return err
		}
		go func() {
			if err := engine.Run(ctx); err != nil {
				log.Error("network policies", "err", err)
			}
		}()
		policies = engine
	}
	var dns *sandboxdns.Server
	if o.dnsListen != "" && o.egress == "internet" && !o.noFirewall {
		if dns, err = startResolver(ctx, o, log); err != nil {
			return err
		}
	}
	for delay := time.Second; ; delay = min(2*delay, 30*time.Second) {
		client, rt, err = connect(ctx, o, res, cacheBytes, cniBinDir, policies, dns, log)
		if err == nil {
			break
		}
		setStatus(err.Error())
		log.Error("not serving yet; retrying", "err", err, "retry_in", delay.String())
		select {
		case <-ctx.Done():
			_ = hs.Close()
			return fmt.Errorf("stopped before serving: %w", err)
		case <-time.After(delay):
		}
	}
	defer client.Close()
	refresh.Store(rt)
	rt.RefreshFirewalls()
	if apiCerts != nil {
		for {
			wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			err := apiCerts.Wait(wctx)
			cancel()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return err
			}
			setStatus(err.Error())
			log.Warn("not serving yet", "err", err)
		}
	}
	api, err := nodeapi.NewServer(nodeapi.ServerConfig{Runtime: rt, Token: token, ClientCert: o.nodeAPITLS, Logger: log})
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(rt.Collector(), rt.Images().Collector(), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if dns != nil {
		reg.MustRegister(dns.Collector())
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/", api.Handler())
	var serving http.Handler = mux
	handler.Store(&serving)
	setStatus("ok")
	if o.drainWhenCordoned {
		if err := watchCordon(ctx, o.kubeconfig, o.node, rt, log); err != nil {
			return err
		}
	}
	go func() {
		if err := rt.Run(ctx); err != nil {
			log.Error("runtime", "err", err)
		}
	}()
	log.Info("serving", "listen", o.listen, "node", o.node, "slots", o.slots, "warm", o.warmSlots)
	if err := <-served; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	cctx, cancel := context.WithTimeout(context.Background(), o.stopTimeout)
	defer cancel()
	if uw != nil {
		if gone, why := uw.Uninstalling(); gone {
			log.Info("uninstall: releasing every sandbox and removing sandman from this worker", "why", why)
			errs := []error{rt.Destroy(cctx), removeImages(cctx, client, o.namespace)}
			if o.daemonSource != "" {
				errs = append(errs, os.Remove(o.daemonPath))
			}
			if o.runcSource != "" {
				errs = append(errs, os.Remove(o.runc))
			}
			if o.runscSource != "" {
				errs = append(errs, os.Remove(o.runsc))
			}
			return errors.Join(errs...)
		}
	}
	// Bound sandboxes keep running for the next agent; warm slots go.
	return rt.Close(cctx)
}

// probe is `sandman-node probe FILE`: exit 0 when the agent wrote "ok",
// else print why it does not serve (the kubelet puts that in the event).
func probe(file string) int {
	b, err := os.ReadFile(file)
	if err != nil {
		fmt.Println("no status yet:", err)
		return 1
	}
	msg := strings.TrimSpace(string(b))
	if msg == "ok" {
		return 0
	}
	fmt.Println(msg)
	return 1
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
		SnapshotRegistry: o.snapshotRegistry, SnapshotPushConfig: o.snapshotPushConfig, SnapshotScratchDir: o.snapshotScratchDir, SnapshotRepositories: o.snapshotRepositories,
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

// installBinary copies a binary from the agent's image (the daemon, runc)
// to the host path sandboxes mount it from or the shim runs it from. The
// new file replaces the old by rename, so sandboxes that mounted the old
// one keep it.
func installBinary(src, dst string) (retErr error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+"-*")
	if err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}

// agentCerts prepares the node API certificate for the node's IP in
// --listen, requested with the pod's ServiceAccount.
func agentCerts(o options, log *slog.Logger) (*nodetls.AgentCerts, error) {
	host, _, err := net.SplitHostPort(o.listen)
	ip := net.ParseIP(host)
	if err != nil || ip == nil || ip.IsUnspecified() {
		return nil, fmt.Errorf("--node-api-tls: --listen %q must name the node's IP (sandman-vk dials it and the certificate names it)", o.listen)
	}
	kc, err := kubeClient(o.kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("--node-api-tls: %w", err)
	}
	return nodetls.NewAgentCerts(kc, o.node, []net.IP{ip}, log)
}

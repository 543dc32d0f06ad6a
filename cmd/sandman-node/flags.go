package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/nodeapi/nodetls"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
)

// options are sandman-node's flags; validate checks them and fills in
// what they parse to.
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
	checkpointDir                               string
	checkpointRepository                        string
	snapshotter                                 string
	lazyPull                                    bool
	lazyConvertRepository                       string
	lazyMetricsURL                              string
	lazyCacheDir                                string
	snapshotRepositories                        []string
	hotSlots                                    string
	hotBudget                                   int
	hotImages                                   []string
	hotMixWindow                                int
	hotMixHalfLife                              time.Duration
	stopTimeout                                 time.Duration
	printVersion                                bool

	// Set by validate.
	level      slog.Level
	token      string            // the pool token, from SANDMAN_POOL_TOKEN or --token-file
	res        runtime.Resources // --cpu, --memory
	cacheBytes int64             // --image-cache-bytes
}

// bindFlags defines the flags on fs, writing into o.
func (o *options) bindFlags(fs *flag.FlagSet) {
	host, _ := os.Hostname()
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
	fs.StringVar(&o.snapshotter, "snapshotter", "overlayfs", "containerd snapshotter that images are unpacked into and sandboxes' root filesystems made from (stargz: the lazy-pulling snapshotter, as a containerd proxy plugin)")
	fs.BoolVar(&o.lazyPull, "lazy-pull", false, "start sandboxes of eStargz images before their pull ends (sandmanctl images convert): --snapshotter mounts their layers lazily and fetches what is read; other images are pulled whole as before")
	fs.StringVar(&o.checkpointRepository, "checkpoint-repository", "", "repository (host[:port]/path) where a drain pushes the gVisor sandboxes it moves to another worker, with their memory (keep it as private as the sandboxes; pushes use --snapshot-push-config); every node agent of the pool needs the same one to restore them (empty: a drain evicts them)")
	fs.StringVar(&o.checkpointDir, "checkpoint-dir", "", "where paused gVisor sandboxes' checkpoints are kept, about their memory's size each (default <state-dir>/checkpoints)")
	fs.StringVar(&o.lazyConvertRepository, "lazy-convert-repository", "", "repository (host[:port]/path; needs --lazy-pull) where the pool keeps eStargz conversions of ordinary public images: the first node to pull one pulls it whole, converts it and pushes it there, every later pull is lazy (read and pushed with --snapshot-push-config; private images are never converted; empty: only images converted ahead with sandmanctl images convert are lazy)")
	fs.StringVar(&o.lazyMetricsURL, "lazy-metrics-url", "", "the lazy-pulling snapshotter's Prometheus endpoint (stargz-snapshotter's metrics_address, http://127.0.0.1:PORT/metrics): the node's image metrics add the bytes it fetched on demand and its fetch and mount times (sandman_node_image_lazy_*)")
	fs.StringVar(&o.lazyCacheDir, "lazy-cache-dir", "", "the lazy-pulling snapshotter's cache of what sandboxes read (stargz-snapshotter: <its --root>/stargz): it counts against --image-cache-bytes, and the images that hold it are removed like the others (empty: not counted)")
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
	fs.BoolVar(&o.printVersion, "version", false, "print the version and exit")
}

// validate checks the flags against each other, parses the sizes and log
// level and reads the pool token (SANDMAN_POOL_TOKEN, or --token-file).
func (o *options) validate() error {
	if o.lazyPull && (o.snapshotter == "overlayfs" || o.snapshotter == "native") {
		return fmt.Errorf("--lazy-pull needs a snapshotter that mounts layers lazily (--snapshotter stargz, stargz-snapshotter as a containerd proxy plugin), not %s", o.snapshotter)
	}
	if o.lazyConvertRepository != "" && !o.lazyPull {
		return fmt.Errorf("--lazy-convert-repository needs --lazy-pull (and --snapshotter stargz)")
	}
	if o.stopTimeout <= 0 {
		return fmt.Errorf("--stop-timeout %v: want a positive duration such as 25s", o.stopTimeout)
	}
	if err := o.level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	o.token = os.Getenv("SANDMAN_POOL_TOKEN")
	if o.tokenFile != "" {
		b, err := os.ReadFile(o.tokenFile)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		o.token = strings.TrimSpace(string(b))
	}
	switch {
	case o.nodeAPITLS && o.token != "":
		return errors.New("give --node-api-tls or a pool secret (--token-file, SANDMAN_POOL_TOKEN), not both")
	case !o.nodeAPITLS && o.token == "":
		return errors.New("no node API credentials: give --node-api-tls (in a cluster), or --token-file or SANDMAN_POOL_TOKEN")
	}
	if o.cpu != "" {
		q, err := resource.ParseQuantity(o.cpu)
		if err != nil {
			return fmt.Errorf("--cpu %q: %w", o.cpu, err)
		}
		o.res.MilliCPU = q.MilliValue()
	}
	if o.memory != "" {
		q, err := resource.ParseQuantity(o.memory)
		if err != nil {
			return fmt.Errorf("--memory %q: %w", o.memory, err)
		}
		o.res.MemoryBytes = q.Value()
	}
	if o.imageCache != "" {
		q, err := resource.ParseQuantity(o.imageCache)
		if err != nil || q.Value() < 0 {
			return fmt.Errorf("--image-cache-bytes %q: want a size such as 50Gi", o.imageCache)
		}
		o.cacheBytes = q.Value()
	}
	if o.runcSource != "" && o.runc == "" {
		return errors.New("--runc-source needs --runc, the host path to copy it to")
	}
	if o.runscSource != "" && o.runsc == "" {
		return errors.New("--runsc-source needs --runsc, the host path to copy it to")
	}
	var err error
	if o.hotBudget, err = hotBudget(o.hotSlots, o.slots, o.warmSlots); err != nil {
		return err
	}
	if o.userNSBase > 1<<32-1 {
		return fmt.Errorf("--user-namespace-base %d: want a uid below 2^32", o.userNSBase)
	}
	return nil
}

// Command sandman-node is the node agent: it keeps pre-warmed containerd
// slots on one worker and serves the node API (runtime/nodeapi) that the
// virtual node drives, with Prometheus metrics on /metrics.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	clog "github.com/containerd/log"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/sandman-dev/sandman/runtime"
	rtcontainerd "github.com/sandman-dev/sandman/runtime/containerd"
	"github.com/sandman-dev/sandman/runtime/nodeapi"
)

type options struct {
	node, containerdAddress, namespace          string
	slots, warmSlots                            int
	stateDir, daemonPath, cniConfDir, cniBinDir string
	listen, tokenFile, cpu, memory, logLevel    string
	guardCIDR, imageCache, hostsDir             string
	prePull                                     []string
	prePullConcurrency                          int
	pidsLimit                                   int64
}

func main() {
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
	fs.StringVar(&o.daemonPath, "daemon-path", "/usr/local/lib/sandman/sandman-daemon", "host path of the static sandman-daemon")
	fs.StringVar(&o.cniConfDir, "cni-conf-dir", "/etc/cni/net.d", "CNI configuration directory")
	fs.StringVar(&o.cniBinDir, "cni-bin-dir", "/opt/cni/bin", "CNI plugin directory")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:9651", "node API and /metrics address (keep it unreachable from sandboxes)")
	fs.StringVar(&o.guardCIDR, "guard-from", "", "slot network CIDR whose addresses are rejected at the node API port (iptables); needed when --listen is reachable from sandboxes")
	fs.StringVar(&o.tokenFile, "token-file", "", "file with the pool secret callers must present (or env SANDMAN_POOL_TOKEN)")
	fs.StringVar(&o.cpu, "cpu", "", "CPU sandboxes may request in total, e.g. 8 (default: all cores)")
	fs.StringVar(&o.memory, "memory", "", "memory sandboxes may request in total, e.g. 16Gi (default: all memory)")
	fs.Int64Var(&o.pidsLimit, "pids-limit", 1024, "processes per sandbox container")
	fs.StringVar(&o.imageCache, "image-cache-bytes", "", "disk budget for images, e.g. 50Gi; least recently used images no slot uses are removed above it (default: no budget)")
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
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: level})).With("component", "node")
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
	if token == "" {
		return errors.New("no pool secret: give --token-file or SANDMAN_POOL_TOKEN")
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
	client, err := ctrd.New(o.containerdAddress, ctrd.WithDefaultNamespace(o.namespace), ctrd.WithTimeout(10*time.Second))
	if err != nil {
		return fmt.Errorf("connect to containerd at %s: %w", o.containerdAddress, err)
	}
	defer client.Close()
	rt, err := rtcontainerd.New(ctx, rtcontainerd.Config{
		Client: client, Namespace: o.namespace, Node: o.node, Slots: o.slots, WarmSlots: o.warmSlots,
		Resources: res, StateDir: o.stateDir, DaemonPath: o.daemonPath,
		CNIConfDir: o.cniConfDir, CNIBinDir: o.cniBinDir, PidsLimit: o.pidsLimit, Logger: log,
		RegistryHostsDir: o.hostsDir, ImageCacheBytes: cacheBytes, PrePull: o.prePull, PrePullConcurrency: o.prePullConcurrency,
	})
	if err != nil {
		return err
	}
	api, err := nodeapi.NewServer(nodeapi.ServerConfig{Runtime: rt, Token: token, Logger: log})
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(rt.Collector(), rt.Images().Collector(), collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.Handle("/", api.Handler())
	l, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	if o.guardCIDR != "" {
		unguard, err := rtcontainerd.GuardPort(o.guardCIDR, l.Addr().(*net.TCPAddr).Port)
		if err != nil {
			return err
		}
		defer func() {
			if err := unguard(); err != nil {
				log.Error("remove the node API guard", "err", err)
			}
		}()
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	go func() {
		if err := rt.Run(ctx); err != nil {
			log.Error("runtime", "err", err)
		}
	}()
	log.Info("serving", "listen", o.listen, "node", o.node, "slots", o.slots, "warm", o.warmSlots)
	if err := hs.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	// Bound sandboxes keep running for the next agent; warm slots go.
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return rt.Close(cctx)
}

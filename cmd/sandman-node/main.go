// Command sandman-node is the node agent: it keeps pre-warmed containerd
// slots on one worker and serves the node API (runtime/nodeapi) that the
// virtual node drives, with Prometheus metrics on /metrics.
//
// Files: flags.go (the flags), serve.go (the node API's listener, served
// from the start), runtime.go (containerd, the runtime, network policies,
// the sandbox resolver), install.go (binaries copied to the host), hot.go,
// cordon.go, uninstall.go.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	clog "github.com/containerd/log"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"k8s.io/klog/v2"

	"github.com/sandman-dev/sandman/internal/buildinfo"
	"github.com/sandman-dev/sandman/runtime/hostexec"
	"github.com/sandman-dev/sandman/runtime/nodeapi"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/sandboxdns"
)

// version is what a release build stamps with -ldflags
// "-X main.version=v1.2.3"; empty, the build info says (buildinfo.Version).
var version string

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
	var o options
	fs := flag.NewFlagSet("sandman-node", flag.ContinueOnError)
	o.bindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.printVersion {
		fmt.Println("sandman-node", buildinfo.Version(version))
		return nil
	}
	if err := o.validate(); err != nil {
		return err
	}
	log := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: o.level})).With("component", "node")
	// client-go (the uninstall watch's informers) logs through klog.
	klog.SetSlogLogger(log)
	// containerd's client logs each registry request at info; its failures
	// reach our log with the pull's error.
	if o.level > slog.LevelDebug {
		_ = clog.SetLevel("warn")
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
	if err := installBinaries(o); err != nil {
		return err
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
	srv, apiCerts, cleanup, err := listenAPI(ctx, o, log)
	if err != nil {
		return err
	}
	defer cleanup()

	var refresh atomic.Pointer[noderuntime.Runtime]
	policies, err := startPolicies(ctx, o, &refresh, log)
	if err != nil {
		return err
	}
	var dns *sandboxdns.Server
	if o.dnsListen != "" && o.egress == "internet" && !o.noFirewall {
		if dns, err = startResolver(ctx, o, log); err != nil {
			return err
		}
	}
	client, rt, err := connectRetrying(ctx, srv, o, cniBinDir, policies, dns, log)
	if err != nil {
		return err
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
			srv.setStatus(err.Error())
			log.Warn("not serving yet", "err", err)
		}
	}
	api, err := nodeapi.NewServer(nodeapi.ServerConfig{Runtime: rt, Token: o.token, ClientCert: o.nodeAPITLS, Logger: log})
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
	srv.serve(mux)
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
	if err := srv.wait(); err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(context.Background(), o.stopTimeout)
	defer cancel()
	if uw != nil {
		if gone, why := uw.Uninstalling(); gone {
			log.Info("uninstall: releasing every sandbox and removing sandman from this worker", "why", why)
			return errors.Join(rt.Destroy(cctx), removeImages(cctx, client, o.namespace), removeBinaries(o))
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

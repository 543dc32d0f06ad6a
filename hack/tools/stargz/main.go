// Command containerd-stargz-grpc is stargz-snapshotter's containerd remote
// snapshotter, built from the library (github.com/containerd/stargz-snapshotter)
// with a main of our own: upstream's command lives in a module the Go module
// proxy does not serve (its go.mod replaces the library with ../). It serves
// containerd's snapshots API on a unix socket; containerd reaches it as a
// proxy plugin. Layers in eStargz are mounted lazily (FUSE) and fetched as
// they are read; any other layer falls back to an ordinary overlayfs layer
// that containerd's unpacker fills.
//
// Not part of the sandman module; see hack/build-tools.sh.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	snapshotsapi "github.com/containerd/containerd/api/services/snapshots/v1"
	"github.com/containerd/containerd/v2/contrib/snapshotservice"
	"github.com/containerd/log"
	"github.com/containerd/stargz-snapshotter/fs"
	"github.com/containerd/stargz-snapshotter/metadata"
	memorymetadata "github.com/containerd/stargz-snapshotter/metadata/memory"
	"github.com/containerd/stargz-snapshotter/service"
	"github.com/containerd/stargz-snapshotter/service/keychain/dockerconfig"
	metrics "github.com/docker/go-metrics"
	"github.com/pelletier/go-toml"
	"google.golang.org/grpc"
)

// config is upstream's file format: the service's settings plus where
// metrics are served.
type config struct {
	service.Config
	MetricsAddress string `toml:"metrics_address"`
}

func main() {
	address := flag.String("address", "/run/containerd-stargz-grpc/containerd-stargz-grpc.sock", "unix socket to serve containerd's snapshots API on")
	root := flag.String("root", "/var/lib/containerd-stargz-grpc", "directory for snapshots and the layer caches")
	configPath := flag.String("config", "", "TOML config (stargz-snapshotter's format; empty: defaults)")
	level := flag.String("log-level", "info", "log level")
	flag.Parse()
	if err := log.SetLevel(*level); err != nil {
		fmt.Fprintln(os.Stderr, "containerd-stargz-grpc:", err)
		os.Exit(2)
	}
	if err := run(*address, *root, *configPath); err != nil {
		fmt.Fprintln(os.Stderr, "containerd-stargz-grpc:", err)
		os.Exit(1)
	}
}

func run(address, root, configPath string) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	var c config
	if configPath != "" {
		tree, err := toml.LoadFile(configPath)
		if err != nil {
			return fmt.Errorf("config %s: %w", configPath, err)
		}
		if err := tree.Unmarshal(&c); err != nil {
			return fmt.Errorf("config %s: %w", configPath, err)
		}
	}
	if c.PassThrough {
		c.Direct = true
	}
	if err := service.Supported(root); err != nil {
		return fmt.Errorf("root %s cannot hold overlayfs snapshots: %w", root, err)
	}

	rs, err := service.NewStargzSnapshotterService(ctx, root, &c.Config,
		service.WithCredsFuncs(dockerconfig.NewDockerconfigKeychain(ctx)),
		service.WithFilesystemOptions(
			fs.WithMetricsLogLevel(log.InfoLevel),
			fs.WithMetadataStore(epochStore),
		))
	if err != nil {
		return fmt.Errorf("snapshotter: %w", err)
	}
	defer rs.Close()

	rpc := grpc.NewServer()
	snapshotsapi.RegisterSnapshotsServer(rpc, snapshotservice.FromSnapshotter(rs))
	if err := os.MkdirAll(filepath.Dir(address), 0o700); err != nil {
		return err
	}
	if err := os.Remove(address); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	l, err := net.Listen("unix", address)
	if err != nil {
		return err
	}
	errc := make(chan error, 2)
	go func() { errc <- rpc.Serve(l) }()
	if c.MetricsAddress != "" {
		ml, err := net.Listen("tcp", c.MetricsAddress)
		if err != nil {
			return fmt.Errorf("metrics: %w", err)
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", metrics.Handler())
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		go func() { errc <- srv.Serve(ml) }()
		defer srv.Close()
	}
	log.G(ctx).WithField("address", address).Info("serving")
	select {
	case <-ctx.Done():
		rpc.GracefulStop()
		return nil
	case err := <-errc:
		return err
	}
}

// epochStore is the in-memory metadata store, with epochReader over it.
func epochStore(sr *io.SectionReader, opts ...metadata.Option) (metadata.Reader, error) {
	r, err := memorymetadata.NewReader(sr, opts...)
	if err != nil {
		return nil, err
	}
	return epochReader{r}, nil
}

// epochReader gives files that eStargz records with no modification time the
// Unix epoch, as a full pull unpacks them. The estargz writer leaves the time
// out for the epoch — the time reproducible builds give every file — and its
// reader turns an absent time into Go's zero time, the year 1: git then
// finds every file racily clean and reads them all at each git status.
type epochReader struct{ metadata.Reader }

func epochAttr(a metadata.Attr) metadata.Attr {
	if a.ModTime.IsZero() {
		a.ModTime = time.Unix(0, 0)
	}
	return a
}

func (r epochReader) GetAttr(id uint32) (metadata.Attr, error) {
	a, err := r.Reader.GetAttr(id)
	return epochAttr(a), err
}

func (r epochReader) GetChild(pid uint32, base string) (uint32, metadata.Attr, error) {
	id, a, err := r.Reader.GetChild(pid, base)
	return id, epochAttr(a), err
}

func (r epochReader) Clone(sr *io.SectionReader) (metadata.Reader, error) {
	c, err := r.Reader.Clone(sr)
	if err != nil {
		return nil, err
	}
	return epochReader{c}, nil
}

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
)

// packages maps each binary to the command that builds it.
var packages = map[string]string{
	"sandman-vk":      "./cmd/sandman-vk",
	"sandman-gateway": "./cmd/sandman-gateway",
	"sandman-node":    "./cmd/sandman-node",
	"sandman-daemon":  "./cmd/sandman-daemon",
	"sandmanctl":      "./cmd/sandmanctl",
	"pause":           "./hack/images/pause",
	"e2e-trainer":     "./e2e/trainer",
}

// placed puts a built binary at a path in an image.
type placed struct{ bin, path string }

// imageSpec is one component image.
type imageSpec struct {
	name  string // repository below the prefix, e.g. sandman-vk
	files []placed
	cfg   Config
}

const nonroot = "65532:65532"

var specs = []imageSpec{
	{name: "sandman-vk",
		files: []placed{{"sandman-vk", "/usr/local/bin/sandman-vk"}},
		cfg:   Config{Entrypoint: []string{"/usr/local/bin/sandman-vk"}, User: nonroot}},
	// The node agent copies the daemon to the host and bind-mounts it into
	// every sandbox; it needs root for containerd, mounts and iptables.
	{name: "sandman-node",
		files: []placed{
			{"sandman-node", "/usr/local/bin/sandman-node"},
			{"sandman-daemon", "/usr/local/lib/sandman/sandman-daemon"},
		},
		cfg: Config{Entrypoint: []string{"/usr/local/bin/sandman-node"}, User: "0:0"}},
	{name: "sandman-gateway",
		files: []placed{{"sandman-gateway", "/usr/local/bin/sandman-gateway"}},
		cfg:   Config{Entrypoint: []string{"/usr/local/bin/sandman-gateway"}, User: nonroot}},
	{name: "sandmanctl",
		files: []placed{{"sandmanctl", "/usr/local/bin/sandmanctl"}},
		cfg:   Config{Entrypoint: []string{"/usr/local/bin/sandmanctl"}, User: nonroot}},
	{name: "pause",
		files: []placed{{"pause", "/pause"}},
		cfg:   Config{Entrypoint: []string{"/pause"}, User: "65535:65535"}},
	{name: "e2e-trainer",
		files: []placed{{"e2e-trainer", "/usr/local/bin/e2e-trainer"}},
		cfg:   Config{Entrypoint: []string{"/usr/local/bin/e2e-trainer"}, User: nonroot}},
}

// listFlag is a repeatable flag whose values may also be comma-separated.
type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }

func (l *listFlag) Set(v string) error {
	for s := range strings.SplitSeq(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

type options struct {
	registry     string
	prefix       string
	tags         listFlag
	images       listFlag
	layoutDir    string
	printDigests bool
	runc         string
	runsc        string
	stargz       string
	version      string
}

// runcPath is where the sandman-node image carries the runc it copies to
// the node (-runc; sandman-node --runc-source).
const runcPath = "/usr/local/lib/sandman/runc"

// runscPath is where it carries gVisor's runsc (-runsc; sandman-node
// --runsc-source), for pods of RuntimeClass handler runsc.
const runscPath = "/usr/local/lib/sandman/runsc"

// stargzPath is where it carries stargz-snapshotter (-stargz), which
// deploy/components/lazy-pull runs beside the agent.
const stargzPath = "/usr/local/bin/containerd-stargz-grpc"

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	var o options
	fs := flag.NewFlagSet("imagebuild", flag.ExitOnError)
	fs.StringVar(&o.registry, "registry", "127.0.0.1:15000", `registry to push to ("" builds without pushing); plain HTTP for loopback`)
	fs.StringVar(&o.prefix, "prefix", "sandman", "repository prefix: images are <registry>/<prefix>/<image>")
	fs.Var(&o.tags, "tag", "tag to push, repeatable or comma-separated (default dev)")
	fs.Var(&o.images, "images", "images to build, comma-separated (default all: "+strings.Join(specNames(), ",")+")")
	fs.StringVar(&o.layoutDir, "layout", "", "also write an OCI image layout to this directory")
	fs.BoolVar(&o.printDigests, "print-digests", false, "print image@sha256:... lines on stdout")
	fs.StringVar(&o.runc, "runc", "", "runc binary (hack/build-tools.sh runc) the sandman-node image carries at "+runcPath+" for the node's sandboxes (required for sandman-node)")
	fs.StringVar(&o.version, "version", "", "version stamped into every binary (-X main.version, which their --version prints); empty: the build info's, \"(devel)\" for these VCS-less builds")
	fs.StringVar(&o.runsc, "runsc", "", "gVisor's runsc (hack/build-tools.sh gvisor) the sandman-node image carries at "+runscPath+" (optional: without it the image's agents run no gVisor pods)")
	fs.StringVar(&o.stargz, "stargz", "", "stargz-snapshotter's containerd-stargz-grpc (hack/build-tools.sh stargz) the sandman-node image carries at "+stargzPath+" for lazy pulling (optional)")
	_ = fs.Parse(os.Args[1:])
	if len(o.tags) == 0 {
		o.tags = listFlag{"dev"}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, log, o); err != nil {
		log.Error("imagebuild failed", "err", err)
		os.Exit(1)
	}
}

func specNames() []string {
	var names []string
	for _, s := range specs {
		names = append(names, s.name)
	}
	return names
}

func run(ctx context.Context, log *slog.Logger, o options) error {
	selected, err := selectSpecs(o.images)
	if err != nil {
		return err
	}
	created := time.Unix(0, 0).UTC()
	if v := os.Getenv("SOURCE_DATE_EPOCH"); v != "" {
		sec, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since the epoch", v)
		}
		created = time.Unix(sec, 0).UTC()
	}

	tmp, err := os.MkdirTemp("", "imagebuild-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var bins []string
	for _, s := range selected {
		for _, f := range s.files {
			if !slices.Contains(bins, f.bin) {
				bins = append(bins, f.bin)
			}
		}
	}
	start := time.Now()
	if err := goBuild(ctx, tmp, bins, o.version); err != nil {
		return err
	}
	log.Info("built binaries", "binaries", strings.Join(bins, ","), "took", time.Since(start).Round(time.Millisecond))

	var ropts []name.Option
	if o.registry != "" && isLoopback(o.registry) {
		ropts = append(ropts, name.Insecure)
	}
	var index []mutate.IndexAddendum
	for _, s := range selected {
		start := time.Now()
		files := make([]File, 0, len(s.files))
		for _, f := range s.files {
			files = append(files, File{Path: f.path, Source: filepath.Join(tmp, f.bin), Mode: 0o755})
		}
		if s.name == "sandman-node" {
			// Built from its own module with cgo (seccomp), not from ours.
			if o.runc == "" {
				return errors.New("image sandman-node: give -runc, the runc its agent copies to the node (hack/build-tools.sh runc builds it)")
			}
			files = append(files, File{Path: runcPath, Source: o.runc, Mode: 0o755})
			if o.runsc != "" {
				files = append(files, File{Path: runscPath, Source: o.runsc, Mode: 0o755})
			}
			if o.stargz != "" {
				files = append(files, File{Path: stargzPath, Source: o.stargz, Mode: 0o755})
			}
		}
		cfg := s.cfg
		cfg.Created = created
		img, err := Build(files, cfg)
		if err != nil {
			return fmt.Errorf("image %s: %w", s.name, err)
		}
		digest, err := img.Digest()
		if err != nil {
			return fmt.Errorf("image %s: %w", s.name, err)
		}
		repo := o.prefix + "/" + s.name
		log.Info("image built", "image", repo, "digest", digest, "took", time.Since(start).Round(time.Millisecond))
		if o.layoutDir != "" {
			index = append(index, layoutEntry(img, repo+":"+o.tags[0]))
		}
		if o.registry != "" {
			repo = o.registry + "/" + repo
			if err := push(ctx, log, img, digest, repo, o.tags, ropts); err != nil {
				return fmt.Errorf("push %s: %w", repo, err)
			}
		}
		if o.printDigests {
			fmt.Printf("%s@%s\n", repo, digest)
		}
	}
	if o.layoutDir != "" {
		if _, err := layout.Write(o.layoutDir, mutate.AppendManifests(empty.Index, index...)); err != nil {
			return fmt.Errorf("layout %s: %w", o.layoutDir, err)
		}
		log.Info("layout written", "dir", o.layoutDir)
	}
	return nil
}

// layoutEntry is img in an OCI layout's index.json, named ref.
func layoutEntry(img v1.Image, ref string) mutate.IndexAddendum {
	return mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{
		Annotations: map[string]string{"org.opencontainers.image.ref.name": ref}}}
}

func selectSpecs(names []string) ([]imageSpec, error) {
	if len(names) == 0 || slices.Equal(names, []string{"all"}) {
		return specs, nil
	}
	var out []imageSpec
	for _, n := range names {
		i := slices.IndexFunc(specs, func(s imageSpec) bool { return s.name == n })
		if i < 0 {
			return nil, fmt.Errorf("unknown image %q: choose from %s", n, strings.Join(specNames(), ","))
		}
		out = append(out, specs[i])
	}
	return out, nil
}

// goBuild builds each binary as a static, reproducible linux/amd64 program
// into dir, from the module the working directory is in, with version (when
// set) as main.version.
func goBuild(ctx context.Context, dir string, bins []string, version string) error {
	gomod, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(gomod))
	if mod == "" || mod == os.DevNull {
		return errors.New("not inside the sandman module: run from the repository root")
	}
	root := filepath.Dir(mod)
	ldflags := "-s -w"
	if version != "" {
		ldflags += " -X main.version=" + version
	}
	for _, b := range bins {
		cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false", "-ldflags", ldflags,
			"-o", filepath.Join(dir, b), packages[b])
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("go build %s: %w", packages[b], err)
		}
	}
	return nil
}

// push writes img as repo:tags[0] unless the registry has it already (the
// registry is asked for each blob too), then points the other tags at it.
// Credentials come from the Docker config (~/.docker/config.json), if any.
func push(ctx context.Context, log *slog.Logger, img v1.Image, digest v1.Hash, repo string, tags []string, ropts []name.Option) error {
	start := time.Now()
	opts := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)}
	for i, tag := range tags {
		ref, err := name.NewTag(repo+":"+tag, ropts...)
		if err != nil {
			return err
		}
		if desc, err := remote.Head(ref, opts...); err == nil && desc.Digest == digest {
			log.Info("tag present", "image", ref.String())
			continue
		}
		if i == 0 {
			err = remote.Write(ref, img, opts...)
		} else {
			err = remote.Tag(ref, img, opts...)
		}
		if err != nil {
			return err
		}
		log.Info("pushed", "image", ref.String(), "digest", digest)
	}
	log.Info("push done", "image", repo, "took", time.Since(start).Round(time.Millisecond))
	return nil
}

// isLoopback says whether host[:port] names this machine.
func isLoopback(hostport string) bool {
	host, _, err := net.SplitHostPort(hostport)
	if err != nil {
		host = hostport
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

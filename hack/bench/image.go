package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/nodeimage"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

const imageBenchNamespace = "sandman-bench-image"

// benchImage: a cold pull and unpack of the Debian task image through
// nodeimage beside containerd's own pull of it, pull throughput, and a bind
// of that image pre-pulled beside the same bind cold (the pull included).
// Every cold sample starts from nothing: the image, its content and its
// snapshots are removed first.
func benchImage(cfg config) ([]row, error) {
	stack, err := framework.Load(cfg.root)
	if err != nil {
		return nil, err
	}
	env := stack.Env
	image := env["DEBIAN_IMAGE"]
	ctx := namespaces.WithNamespace(context.Background(), imageBenchNamespace)
	client, err := stack.NewContainerd(imageBenchNamespace)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	forget := func() error {
		err := client.ImageService().Delete(ctx, image, images.SynchronousDelete())
		if err != nil && !errdefs.IsNotFound(err) {
			return err
		}
		return nil
	}
	defer forget()
	n := min(cfg.n, 5)

	// Baseline: containerd's client pull with unpack, nothing around it.
	resolver := docker.NewResolver(docker.ResolverOptions{Hosts: docker.ConfigureDefaultRegistries(docker.WithPlainHTTP(docker.MatchLocalhost))})
	var compressed int64
	raw, err := sampleN(n, func() (time.Duration, error) {
		if err := forget(); err != nil {
			return 0, err
		}
		start := time.Now()
		img, err := client.Pull(ctx, image, ctrd.WithPullUnpack, ctrd.WithResolver(resolver))
		elapsed := time.Since(start)
		if err == nil {
			compressed, err = img.Size(ctx)
		}
		return elapsed, err
	})
	if err != nil {
		return nil, fmt.Errorf("containerd pull: %w", err)
	}
	ours, err := sampleN(n, func() (time.Duration, error) {
		if err := forget(); err != nil {
			return 0, err
		}
		m, err := nodeimage.New(ctx, nodeimage.Config{Client: client, Namespace: imageBenchNamespace, Node: "bench"})
		if err != nil {
			return 0, err
		}
		start := time.Now()
		_, err = m.Ensure(ctx, image, nil)
		return time.Since(start), err
	})
	if err != nil {
		return nil, fmt.Errorf("nodeimage pull: %w", err)
	}
	mb := float64(compressed) / (1 << 20)
	rows := []row{
		{name: fmt.Sprintf("image: cold pull + unpack, Debian task image (%.0f MiB compressed), nodeimage.Ensure", mb), n: n,
			p50: ms(ours.p50()), p99: ms(ours.p99()), baseline: "containerd client Pull+unpack " + ms(raw.p50()),
			ratio: ratio(ours.p50(), raw.p50()), note: "local registry on loopback; every sample from an empty cache"},
		{name: "image: pull throughput (compressed bytes / cold pull time)", n: n,
			p50: fmt.Sprintf("%.1f MiB/s", mb/ours.p50().Seconds()), p99: fmt.Sprintf("%.1f MiB/s", mb/ours.p99().Seconds()),
			baseline: fmt.Sprintf("%.1f MiB/s", mb/raw.p50().Seconds()), ratio: ratio(raw.p50(), ours.p50()),
			note: "p99 column: the slowest pull's rate; unpack (gunzip + overlay writes) bounds it here"},
	}

	// Binds of the Debian image: pre-pulled (baseline) and cold.
	tmp, err := os.MkdirTemp("", "sandman-bench-image")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	daemonBin, err := buildDaemon(cfg.root, tmp)
	if err != nil {
		return nil, err
	}
	be := benchEnv{client: client, env: env, daemonBin: daemonBin, namespace: imageBenchNamespace}
	rt, stop, err := be.startRuntime(ctx, "bench-image", func(c *noderuntime.Config) { c.Slots, c.WarmSlots = 4, 2 })
	if err != nil {
		return nil, err
	}
	defer stop()
	if err := waitCount(ctx, rt, runtime.StateWarm, 2); err != nil {
		return nil, err
	}
	i := 0
	bind := func(cold bool) func() (time.Duration, error) {
		return func() (time.Duration, error) {
			if cold {
				if err := forget(); err != nil {
					return 0, err
				}
			}
			if err := waitCount(ctx, rt, runtime.StateWarm, 1); err != nil {
				return 0, err
			}
			i++
			uid := "img-" + strconv.Itoa(i)
			start := time.Now()
			_, err := rt.Bind(ctx, runtimetest.Request(uid, image))
			elapsed := time.Since(start)
			if err != nil {
				return 0, err
			}
			return elapsed, rt.Release(ctx, uid, 0)
		}
	}
	warm, err := sampleN(min(cfg.n, 20), bind(false))
	if err != nil {
		return nil, fmt.Errorf("bind pre-pulled: %w", err)
	}
	cold, err := sampleN(n, bind(true))
	if err != nil {
		return nil, fmt.Errorf("bind cold: %w", err)
	}
	rows = append(rows, row{name: "bind: Debian task image cold (pull + unpack + start)", n: n,
		p50: ms(cold.p50()), p99: ms(cold.p99()), baseline: "same bind, image pre-pulled " + ms(warm.p50()),
		ratio: ratio(cold.p50(), warm.p50()), note: "pre-pulled: a generic warm slot, no pull; what pre-pull saves per first bind of an image on a node"})
	return rows, nil
}

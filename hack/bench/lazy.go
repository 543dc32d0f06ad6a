package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/time/rate"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/lazyimage"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// lazyNamespace keeps the suite's images apart; they are all deleted at the
// end.
const lazyNamespace = "sandman-bench-lazy"

// benchLazy measures lazy pulling (the stack's stargz-snapshotter, node
// runtimes with --lazy-pull) against today's full pulls into overlayfs, from
// the stack's registry behind a proxy that counts bytes and, throttled,
// paces them to BENCH_LAZY_MIBPS (100) MiB/s. Its parts:
//
//   - cold: a first bind → first command answered, for an image of
//     BENCH_LAZY_MIB (2048) MiB of incompressible files, BENCH_LAZY_RUNS (3)
//     runs each, throttled and not, and the bytes fetched; then warm binds
//     of that image, lazy against overlayfs;
//   - throughput: git status over a 5,000-file repository and a pytest run
//     in a Debian task image once its files were read, lazy against fully
//     pulled;
//   - prefetch: a cold bind → pytest in a Debian task image with 256 MiB of
//     data, converted with nothing prioritized and with the files pytest read
//     in a full pull's sandbox prioritized (recorded by their access times),
//     from the throttled registry and from one that also waits
//     BENCH_LAZY_RTT_MS (20) before each answer;
//   - zipf: a trace of BENCH_LAZY_TRACE (200) binds over BENCH_LAZY_IMAGES
//     (50) images of 64 MiB with Zipf popularity on one node whose disk
//     budget holds 10 of them pulled whole: mean and p99 bind → first
//     command, and the bytes fetched (the CDF is drawn to
//     docs/lazy-zipf-bind.svg).
//
// BENCH_LAZY_ONLY=cold,throughput,prefetch,zipf runs only those parts.
func benchLazy(cfg config) ([]row, error) {
	ctx := context.Background()
	be, closeEnv, err := openBenchEnv(cfg, lazyNamespace)
	if err != nil {
		return nil, err
	}
	defer closeEnv()
	stack, err := framework.Load(cfg.root)
	if err != nil {
		return nil, err
	}
	l := &lazyBench{be: be, stack: stack, mib: envInt("BENCH_LAZY_MIB", 2048), runs: envInt("BENCH_LAZY_RUNS", 3),
		trace: envInt("BENCH_LAZY_TRACE", 200), images: envInt("BENCH_LAZY_IMAGES", 50)}
	if l.throttled, err = startRegistryProxy(stack.Registry, envInt("BENCH_LAZY_MIBPS", 100), 0); err != nil {
		return nil, err
	}
	defer l.throttled.close()
	if l.direct, err = startRegistryProxy(stack.Registry, 0, 0); err != nil {
		return nil, err
	}
	defer l.direct.close()
	rtt := time.Duration(envInt("BENCH_LAZY_RTT_MS", 20)) * time.Millisecond
	if l.remote, err = startRegistryProxy(stack.Registry, l.throttled.mibps, rtt); err != nil {
		return nil, err
	}
	defer l.remote.close()
	if l.tmp, err = os.MkdirTemp(be.env["SANDMAN_STATE"], "bench-lazy-"); err != nil {
		return nil, err
	}
	defer os.RemoveAll(l.tmp)
	defer func() { _ = l.deleteImages() }()

	var rows []row
	only := os.Getenv("BENCH_LAZY_ONLY")
	for _, part := range []struct {
		name string
		run  func(context.Context) ([]row, error)
	}{{"cold", l.cold}, {"throughput", l.throughput}, {"prefetch", l.prefetch}, {"zipf", l.zipf}} {
		if only != "" && !slices.Contains(strings.Split(only, ","), part.name) {
			continue
		}
		r, err := part.run(ctx)
		rows = append(rows, r...)
		if err != nil {
			return rows, err
		}
	}
	return rows, nil
}

type lazyBench struct {
	be                       benchEnv
	stack                    *framework.Stack
	mib, runs, trace, images int
	throttled, direct        *registryProxy
	remote                   *registryProxy // throttled, and BENCH_LAZY_RTT_MS before each answer
	tmp                      string
	seq                      int
}

// runtimes starts the two node runtimes compared: lazy (stargz,
// --lazy-pull, its metrics and cache counted) and full (overlayfs).
func (l *lazyBench) runtimes(ctx context.Context, budget int64) (lazy, full *noderuntime.Runtime, stop func(), err error) {
	lazy, stopLazy, err := l.be.startRuntime(ctx, "bench-lazy-stargz", func(c *noderuntime.Config) {
		c.Slots, c.WarmSlots, c.ImageCacheBytes = 4, 2, budget
		c.Snapshotter, c.LazyPull = "stargz", true
		c.LazyMetricsURL, c.LazyCacheDir = l.be.env["STARGZ_METRICS_URL"], l.be.env["STARGZ_CACHE_DIR"]
	})
	if err != nil {
		return nil, nil, nil, err
	}
	full, stopFull, err := l.be.startRuntime(ctx, "bench-lazy-overlay", func(c *noderuntime.Config) {
		c.Slots, c.WarmSlots, c.ImageCacheBytes = 4, 2, budget
	})
	if err != nil {
		stopLazy()
		return nil, nil, nil, err
	}
	return lazy, full, func() { stopLazy(); stopFull() }, nil
}

// copyTo writes img under a new repository of the registry (its blobs
// mounted, nothing uploaded again) and returns its name through proxy p:
// a name no snapshotter or content store has seen.
func (l *lazyBench) copyTo(ctx context.Context, img v1.Image, p *registryProxy) (string, error) {
	l.seq++
	ref, err := name.ParseReference(fmt.Sprintf("%s/bench-lazy/run-%d-%d:v1", l.stack.Registry, time.Now().UnixNano(), l.seq))
	if err != nil {
		return "", err
	}
	if err := remote.Write(ref, img, remote.WithContext(ctx)); err != nil {
		return "", err
	}
	d, err := img.Digest()
	if err != nil {
		return "", err
	}
	return p.host + "/" + ref.Context().RepositoryStr() + "@" + d.String(), nil
}

// firstCommand binds uid to image on rt and waits until cmd answers in it;
// it returns the time from the bind and the sandbox's daemon.
func firstCommand(ctx context.Context, rt *noderuntime.Runtime, uid, image string, cmd ...string) (time.Duration, *client.Client, error) {
	start := time.Now()
	slot, err := rt.Bind(ctx, runtimetest.Request(uid, image))
	if err != nil {
		return 0, nil, err
	}
	c, err := client.New(slot.IP+":49983", client.WithToken(runtimetest.Token))
	if err != nil {
		return 0, nil, err
	}
	for time.Since(start) < 5*time.Minute {
		r, err := c.Exec(ctx, api.ExecRequest{Cmd: cmd})
		if err == nil && r.ExitCode == 0 {
			return time.Since(start), c, nil
		}
		if err == nil {
			return 0, nil, fmt.Errorf("%v in %s: exit %d: %s", cmd, image, r.ExitCode, r.Stderr)
		}
		time.Sleep(time.Millisecond)
	}
	return 0, nil, fmt.Errorf("%s: no answer 5 minutes after the bind", uid)
}

// cold: the big image's first bind → first command, lazy and full,
// throttled and direct; then warm binds of it.
func (l *lazyBench) cold(ctx context.Context) ([]row, error) {
	fmt.Fprintf(os.Stderr, "lazy: building a %d MiB image and its eStargz conversion\n", l.mib)
	src, conv, err := l.bigImage(ctx)
	if err != nil {
		return nil, err
	}
	lazyRT, fullRT, stop, err := l.runtimes(ctx, 0)
	if err != nil {
		return nil, err
	}
	defer stop()
	var rows []row
	var lazyWarm, fullWarm string
	for _, p := range []*registryProxy{l.throttled, l.direct} {
		var times [2]durations
		var fetched [2]int64
		for i := range l.runs {
			for k, mode := range []struct {
				rt  *noderuntime.Runtime
				img v1.Image
			}{{fullRT, src}, {lazyRT, conv}} {
				ref, err := l.copyTo(ctx, mode.img, p)
				if err != nil {
					return rows, err
				}
				p.reset()
				uid := fmt.Sprintf("cold-%d-%d-%d", k, i, l.seq)
				d, _, err := firstCommand(ctx, mode.rt, uid, ref, "cat", "/app/hello.txt")
				if err != nil {
					return rows, err
				}
				times[k] = append(times[k], d)
				fetched[k] += p.bytes.Load()
				if err := mode.rt.Release(ctx, uid, 0); err != nil {
					return rows, err
				}
				// The next run starts cold: no content, no snapshot.
				if err := l.deleteImages(); err != nil {
					return rows, err
				}
				if k == 0 {
					fullWarm = ref
				} else {
					lazyWarm = ref
				}
			}
		}
		what := "unthrottled"
		if p.mibps > 0 {
			what = fmt.Sprintf("registry at %d MiB/s", p.mibps)
		}
		rows = append(rows, row{
			name: fmt.Sprintf("lazy: %d MiB image, cold bind → first command, %s", l.mib, what), n: l.runs,
			p50: ms(times[1].p50()), p99: ms(times[1].p99()), baseline: "full pull into overlayfs " + ms(times[0].p50()),
			ratio: ratio(times[1].p50(), times[0].p50()),
			note:  fmt.Sprintf("fetched by the first command: lazy %.1f MB, full %.1f MB (per run)", float64(fetched[1])/float64(l.runs)/1e6, float64(fetched[0])/float64(l.runs)/1e6),
		})
	}
	// Warm: the image is on the node.
	i := 0
	bind := func(rt *noderuntime.Runtime, ref string) func() error {
		return func() error {
			i++
			uid := "warm-" + strconv.Itoa(i)
			if _, err := rt.Bind(ctx, runtimetest.Request(uid, ref)); err != nil {
				return err
			}
			return rt.Release(ctx, uid, 0)
		}
	}
	for _, f := range []func() error{bind(lazyRT, lazyWarm), bind(fullRT, fullWarm)} {
		if err := f(); err != nil { // pulls it again
			return rows, err
		}
	}
	lz, fl, err := timeInterleaved(20, bind(lazyRT, lazyWarm), bind(fullRT, fullWarm))
	if err != nil {
		return rows, err
	}
	rows = append(rows, row{name: "lazy: warm bind (image on the node), stargz", n: len(lz), p50: ms(lz.p50()), p99: ms(lz.p99()),
		baseline: "overlayfs " + ms(fl.p50()), ratio: ratio(lz.p50(), fl.p50()), note: "goal ≤ 1.1×"})
	return rows, nil
}

// bigImage pushes busybox plus l.mib MiB of random files (layers of 256 MiB)
// plus /app/hello.txt, and its conversion; it returns both as read from
// the registry.
func (l *lazyBench) bigImage(ctx context.Context) (src, conv v1.Image, err error) {
	base, err := remoteImage(ctx, l.stack.BusyboxImage)
	if err != nil {
		return nil, nil, err
	}
	var layers []v1.Layer
	for i := range (l.mib + 255) / 256 {
		mib := min(256, l.mib-256*i)
		if layers, err = appendRandomLayer(layers, fmt.Sprintf("data/%d", i), mib/8, 8<<20, uint64(i)); err != nil {
			return nil, nil, err
		}
	}
	app, err := tarLayer(map[string]string{"app/hello.txt": "hello lazy\n"})
	if err != nil {
		return nil, nil, err
	}
	img, err := mutate.AppendLayers(base, append(layers, app)...)
	if err != nil {
		return nil, nil, err
	}
	return l.pushAndConvert(ctx, img, "big", []string{"app/hello.txt"})
}

// pushAndConvert pushes img as bench-lazy/NAME:v1 and its conversion as
// :v1-esgz, and reads both back from the registry.
func (l *lazyBench) pushAndConvert(ctx context.Context, img v1.Image, tag string, prioritized []string) (src, conv v1.Image, err error) {
	src, conv, _, err = l.pushAndConvertRef(ctx, img, tag, prioritized)
	return src, conv, err
}

// pushAndConvertRef is pushAndConvert that also names the source.
func (l *lazyBench) pushAndConvertRef(ctx context.Context, img v1.Image, tag string, prioritized []string) (src, conv v1.Image, sref name.Reference, err error) {
	repo := fmt.Sprintf("%s/bench-lazy/%s-%d", l.stack.Registry, tag, time.Now().UnixNano())
	if sref, err = name.ParseReference(repo + ":v1"); err != nil {
		return nil, nil, nil, err
	}
	if err := remote.Write(sref, img, remote.WithContext(ctx)); err != nil {
		return nil, nil, nil, err
	}
	cref, err := name.ParseReference(repo + ":v1-esgz")
	if err != nil {
		return nil, nil, nil, err
	}
	res, err := lazyimage.Convert(ctx, sref, cref, lazyimage.Options{Prioritized: prioritized, TempDir: l.tmp})
	if err != nil {
		return nil, nil, nil, err
	}
	if src, err = remote.Image(sref, remote.WithContext(ctx)); err != nil {
		return nil, nil, nil, err
	}
	conv, err = remote.Image(res.Target, remote.WithContext(ctx))
	return src, conv, sref, err
}

// throughput: git status over a 5,000-file repository and pytest in a
// Debian task image, lazy (files read once already) against fully pulled.
func (l *lazyBench) throughput(ctx context.Context) ([]row, error) {
	base, err := remoteImage(ctx, l.stack.DebianImage)
	if err != nil {
		return nil, err
	}
	repo, err := gitRepoLayer(filepath.Join(l.tmp, "repo"), 5000)
	if err != nil {
		return nil, err
	}
	app, err := pytestProject("")
	if err != nil {
		return nil, err
	}
	fmt.Fprintln(os.Stderr, "lazy: building a Debian task image (a git repository, a Python project) and its conversion")
	img, err := mutate.AppendLayers(base, repo, app)
	if err != nil {
		return nil, err
	}
	src, conv, err := l.pushAndConvert(ctx, img, "task", nil)
	if err != nil {
		return nil, err
	}
	lazyRT, fullRT, stop, err := l.runtimes(ctx, 0)
	if err != nil {
		return nil, err
	}
	defer stop()
	clients := map[*noderuntime.Runtime]*client.Client{}
	for rt, img := range map[*noderuntime.Runtime]v1.Image{lazyRT: conv, fullRT: src} {
		ref, err := l.copyTo(ctx, img, l.direct)
		if err != nil {
			return nil, err
		}
		if _, clients[rt], err = firstCommand(ctx, rt, fmt.Sprintf("task-%d", l.seq), ref, "true"); err != nil {
			return nil, err
		}
	}
	var rows []row
	for _, w := range []struct{ name, shell string }{
		{"git status over 5,000 files", "cd /repo && git status --porcelain >/dev/null"},
		{"pytest, 50 tests", "cd /app && python3 -m pytest -q -p no:cacheprovider >/dev/null"},
	} {
		run := func(c *client.Client) func() error {
			return func() error {
				r, err := c.Exec(ctx, api.ExecRequest{Shell: w.shell, ShellPath: "/bin/sh"})
				if err == nil && r.ExitCode != 0 {
					err = fmt.Errorf("%s: exit %d: %s", w.shell, r.ExitCode, r.Stderr)
				}
				return err
			}
		}
		// Once each first: the lazy sandbox fetches what it reads.
		for _, c := range clients {
			if err := run(c)(); err != nil {
				return rows, err
			}
		}
		lz, fl, err := timeInterleaved(10, run(clients[lazyRT]), run(clients[fullRT]))
		if err != nil {
			return rows, err
		}
		rows = append(rows, row{name: "lazy: " + w.name + " once fetched, stargz", n: len(lz), p50: ms(lz.p50()), p99: ms(lz.p99()),
			baseline: "fully pulled (overlayfs) " + ms(fl.p50()), ratio: ratio(lz.p50(), fl.p50()), note: "goal ≤ 1.2×"})
	}
	return rows, nil
}

// prefetch: what prioritizing the files a task reads first saves. The reads
// are recorded in a sandbox of the fully pulled image by access times (find
// -anewer). That misses most of them: overlayfs opens a lower layer's files
// with O_NOATIME, so only files the task wrote to the upper layer show up
// (docs/benchmarks.md); the request counts in the rows show how little the
// prefetch then covers.
func (l *lazyBench) prefetch(ctx context.Context) ([]row, error) {
	if err := l.deleteImages(); err != nil {
		return nil, err
	}
	base, err := remoteImage(ctx, l.stack.DebianImage)
	if err != nil {
		return nil, err
	}
	layers, err := appendRandomLayer(nil, "data", 32, 8<<20, 77)
	if err != nil {
		return nil, err
	}
	app, err := pytestProject("import json, email.parser, http.client\n")
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(base, append(layers, app)...)
	if err != nil {
		return nil, err
	}
	fmt.Fprintln(os.Stderr, "lazy: prefetch: a Debian task image with 256 MiB of data, converted with nothing prioritized")
	src, plain, srcRef, err := l.pushAndConvertRef(ctx, img, "prefetch", nil)
	if err != nil {
		return nil, err
	}
	lazyRT, fullRT, stop, err := l.runtimes(ctx, 0)
	if err != nil {
		return nil, err
	}
	defer stop()
	const task = "cd /app && python3 -m pytest -q -p no:cacheprovider >/dev/null"
	ref, err := l.copyTo(ctx, src, l.direct)
	if err != nil {
		return nil, err
	}
	_, c, err := firstCommand(ctx, fullRT, "prefetch-record", ref, "true")
	if err != nil {
		return nil, err
	}
	r, err := c.Exec(ctx, api.ExecRequest{Shell: "touch /tmp/.mark && sleep 1.1 && " + task + " && find / -xdev -type f -anewer /tmp/.mark ! -path '/tmp/*' 2>/dev/null", ShellPath: "/bin/sh"})
	if err == nil && r.ExitCode != 0 {
		err = fmt.Errorf("recording the task's reads: exit %d: %s", r.ExitCode, r.Stderr)
	}
	if err != nil {
		return nil, err
	}
	var read []string
	for _, f := range strings.Fields(string(r.Stdout)) {
		read = append(read, strings.TrimPrefix(f, "/"))
	}
	if err := fullRT.Release(ctx, "prefetch-record", 0); err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "lazy: prefetch: the task read %d files; converting with them prioritized\n", len(read))
	sref, err := name.ParseReference(fmt.Sprintf("%s/bench-lazy/prefetch-rec-%d:v1-esgz", l.stack.Registry, time.Now().UnixNano()))
	if err != nil {
		return nil, err
	}
	res, err := lazyimage.Convert(ctx, srcRef, sref, lazyimage.Options{Prioritized: read, TempDir: l.tmp})
	if err != nil {
		return nil, err
	}
	prio, err := remote.Image(res.Target, remote.WithContext(ctx))
	if err != nil {
		return nil, err
	}
	// The same runs from the throttled registry and from one that also
	// takes BENCH_LAZY_RTT_MS to answer each request: prioritized files are
	// fetched in one range before the first read, the others a chunk per
	// request as they are read, so what prefetch saves is mostly round trips.
	var rows []row
	for _, p := range []*registryProxy{l.throttled, l.remote} {
		var times [2]durations
		var fetched, requests [2]int64
		for i := range l.runs {
			for k, conv := range []v1.Image{plain, prio} {
				if err := l.deleteImages(); err != nil {
					return rows, err
				}
				ref, err := l.copyTo(ctx, conv, p)
				if err != nil {
					return rows, err
				}
				p.reset()
				uid := fmt.Sprintf("prefetch-%d-%d", k, i)
				d, _, err := firstCommand(ctx, lazyRT, uid, ref, "sh", "-c", task)
				if err != nil {
					return rows, err
				}
				times[k] = append(times[k], d)
				fetched[k] += p.bytes.Load()
				requests[k] += p.requests.Load()
				if err := lazyRT.Release(ctx, uid, 0); err != nil {
					return rows, err
				}
			}
		}
		perRun := func(v int64) float64 { return float64(v) / float64(l.runs) }
		rows = append(rows, row{
			name: fmt.Sprintf("lazy: cold bind → pytest, Debian task image, registry at %d MiB/s, %s before each answer, the %d files it read prioritized",
				p.mibps, p.rtt, len(read)),
			n: l.runs, p50: ms(times[1].p50()), p99: ms(times[1].p99()),
			baseline: "nothing prioritized " + ms(times[0].p50()), ratio: ratio(times[1].p50(), times[0].p50()),
			note: fmt.Sprintf("fetched by then (per run): prioritized %.1f MB in %.0f requests, not %.1f MB in %.0f requests",
				perRun(fetched[1])/1e6, perRun(requests[1]), perRun(fetched[0])/1e6, perRun(requests[0])),
		})
	}
	return rows, nil
}

// zipf: BENCH_LAZY_TRACE binds over BENCH_LAZY_IMAGES images of 64 MiB,
// Zipf popularity, on one node with a budget of 10 images pulled whole,
// through the throttled registry; each first command reads the app file and
// one of the image's eight 8 MiB files.
func (l *lazyBench) zipf(ctx context.Context) ([]row, error) {
	fmt.Fprintf(os.Stderr, "lazy: building %d images of 64 MiB and their conversions\n", l.images)
	base, err := remoteImage(ctx, l.stack.BusyboxImage)
	if err != nil {
		return nil, err
	}
	srcs, convs := make([]v1.Image, l.images), make([]v1.Image, l.images)
	for i := range l.images {
		layers, err := appendRandomLayer(nil, "data", 8, 8<<20, uint64(1000+i))
		if err != nil {
			return nil, err
		}
		app, err := tarLayer(map[string]string{"app/hello.txt": fmt.Sprintf("image %d\n", i)})
		if err != nil {
			return nil, err
		}
		img, err := mutate.AppendLayers(base, append(layers, app)...)
		if err != nil {
			return nil, err
		}
		if srcs[i], convs[i], err = l.pushAndConvert(ctx, img, fmt.Sprintf("zipf%d", i), []string{"app/hello.txt"}); err != nil {
			return nil, err
		}
	}
	// Budget: 10 images as a full pull holds them (compressed + unpacked).
	const budget = 10 * (64 + 64 + 4) << 20
	zf := rand.NewZipf(rand.New(rand.NewPCG(1, 2)), 1.1, 1, uint64(l.images-1))
	trace := make([]int, l.trace)
	for i := range trace {
		trace[i] = int(zf.Uint64())
	}
	if err := l.deleteImages(); err != nil {
		return nil, err
	}
	lazyRT, fullRT, stop, err := l.runtimes(ctx, budget)
	if err != nil {
		return nil, err
	}
	defer stop()
	var rows []row
	series := map[string]durations{}
	var means [2]time.Duration
	for k, mode := range []struct {
		name string
		rt   *noderuntime.Runtime
		imgs []v1.Image
	}{{"full pull", fullRT, srcs}, {"lazy", lazyRT, convs}} {
		refs := make([]string, l.images)
		for i, img := range mode.imgs {
			if refs[i], err = l.copyTo(ctx, img, l.throttled); err != nil {
				return rows, err
			}
		}
		l.throttled.reset()
		var d durations
		var sum time.Duration
		for i, img := range trace {
			uid := fmt.Sprintf("zipf-%d-%d", k, i)
			t, _, err := firstCommand(ctx, mode.rt, uid, refs[img], "sh", "-c", fmt.Sprintf("cat /app/hello.txt && sha256sum /data/%d >/dev/null", i%8))
			if err != nil {
				return rows, err
			}
			d, sum = append(d, t), sum+t
			if err := mode.rt.Release(ctx, uid, 0); err != nil {
				return rows, err
			}
		}
		means[k] = sum / time.Duration(len(d))
		series[mode.name] = slices.Clone(d)
		u := mode.rt.Images().Usage(ctx)
		rows = append(rows, row{name: fmt.Sprintf("lazy: Zipf trace, %d binds over %d images of 64 MiB, budget 10 images, %s", l.trace, l.images, mode.name),
			n: len(d), p50: ms(d.p50()), p99: ms(d.p99()), baseline: "", ratio: "",
			note: fmt.Sprintf("mean %s; fetched %.0f MB; %d images on the node at the end, %d MiB", ms(means[k]), float64(l.throttled.bytes.Load())/1e6, u.Images, u.Bytes>>20)})
	}
	rows[len(rows)-1].baseline = "full pull, mean " + ms(means[0])
	rows[len(rows)-1].ratio = ratio(means[1], means[0])
	svg := cdfSVGAxes(fmt.Sprintf("Zipf trace: %d binds over %d images of 64 MiB, budget 10 images, registry at %d MiB/s — bind → first command, cumulative", l.trace, l.images, l.throttled.mibps),
		"bind → first command answered", "binds", series)
	if err := os.WriteFile(filepath.Join(l.stack.Root, "docs", "lazy-zipf-bind.svg"), []byte(svg), 0o644); err != nil {
		return rows, err
	}
	return rows, nil
}

// deleteImages removes every image of the suite's namespace, with its
// content and snapshots (containerd's synchronous GC).
func (l *lazyBench) deleteImages() error {
	ctx := namespaces.WithNamespace(context.Background(), lazyNamespace)
	is := l.be.client.ImageService()
	imgs, err := is.List(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, img := range imgs {
		if err := is.Delete(ctx, img.Name, images.SynchronousDelete()); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete %s: %w", img.Name, err))
		}
	}
	return errors.Join(errs...)
}

func remoteImage(ctx context.Context, ref string) (v1.Image, error) {
	r, err := name.ParseReference(ref)
	if err != nil {
		return nil, err
	}
	return remote.Image(r, remote.WithContext(ctx))
}

// pytestProject is a layer with /app/calc.py and 50 pytest files testing
// it, each starting with header (imports that make pytest read more).
func pytestProject(header string) (v1.Layer, error) {
	project := map[string]string{"app/calc.py": "def add(a, b):\n    return a + b\n"}
	for i := range 50 {
		project[fmt.Sprintf("app/test_calc%d.py", i)] = fmt.Sprintf("%sfrom calc import add\n\ndef test_add():\n    assert add(%d, 1) == %d\n", header, i, i+1)
	}
	return tarLayer(project)
}

// appendRandomLayer appends a layer of n files dir/0..n-1 of size bytes of
// incompressible data, generated anew (the same) each time it is read.
func appendRandomLayer(layers []v1.Layer, dir string, n, size int, seed uint64) ([]v1.Layer, error) {
	open := func() (io.ReadCloser, error) {
		pr, pw := io.Pipe()
		go func() {
			tw := tar.NewWriter(pw)
			src := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16), byte(seed >> 24)})
			err := tw.WriteHeader(&tar.Header{Name: dir + "/", Typeflag: tar.TypeDir, Mode: 0o755})
			for i := 0; i < n && err == nil; i++ {
				if err = tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("%s/%d", dir, i), Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(size)}); err == nil {
					_, err = io.CopyN(tw, src, int64(size))
				}
			}
			if err == nil {
				err = tw.Close()
			}
			pw.CloseWithError(err)
		}()
		return pr, nil
	}
	layer, err := tarball.LayerFromOpener(open, tarball.WithCompressionLevel(gzip.BestSpeed))
	if err != nil {
		return nil, err
	}
	return append(layers, layer), nil
}

func tarLayer(files map[string]string) (v1.Layer, error) {
	var buf strings.Builder
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range files {
			if !yield(n) {
				return
			}
		}
	})
	for _, n := range names {
		if d := filepath.Dir(n); !dirs[d] {
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Name: d + "/", Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
				return nil, err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Name: n, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(files[n]))}); err != nil {
			return nil, err
		}
		if _, err := io.WriteString(tw, files[n]); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	data := buf.String()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(data)), nil })
}

// gitRepoLayer makes a git repository of n small files in dir (with the
// host's git) and returns it as a layer at /repo.
func gitRepoLayer(dir string, n int) (v1.Layer, error) {
	for i := range n {
		p := filepath.Join(dir, fmt.Sprintf("pkg%d/mod%d.py", i/100, i))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(p, fmt.Appendf(nil, "VALUE = %d\n", i), 0o644); err != nil {
			return nil, err
		}
	}
	for _, args := range [][]string{{"init", "-q"}, {"add", "."}, {"-c", "user.name=bench", "-c", "user.email=bench@sandman", "commit", "-qm", "bench"}} {
		cmd := exec.Command("git", append([]string{"-C", dir}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("git %v: %v: %s", args, err, out)
		}
	}
	// Tarred once, in memory: reading the files changes their atime.
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		hdr := &tar.Header{Name: filepath.Join("repo", rel), Mode: int64(info.Mode().Perm()), Typeflag: tar.TypeReg, Size: info.Size()}
		if d.IsDir() {
			hdr.Name, hdr.Typeflag, hdr.Size = hdr.Name+"/", tar.TypeDir, 0
		} else if !info.Mode().IsRegular() {
			return nil
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if d.IsDir() {
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		_, err = tw.Write(b)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		return nil, err
	}
	data := buf.Bytes()
	open := func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
	return tarball.LayerFromOpener(open)
}

// registryProxy fronts a registry: it counts the requests and the bytes of
// its answers; with mibps > 0 it paces them all together to that rate, and
// with rtt > 0 it holds each request that long before passing it on (a
// remote registry's time to first byte).
type registryProxy struct {
	host     string
	mibps    int
	rtt      time.Duration
	bytes    atomic.Int64
	requests atomic.Int64
	srv      *http.Server
}

func startRegistryProxy(upstream string, mibps int, rtt time.Duration) (*registryProxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &registryProxy{host: ln.Addr().String(), mibps: mibps, rtt: rtt}
	var limit *rate.Limiter
	if mibps > 0 {
		limit = rate.NewLimiter(rate.Limit(mibps<<20), 1<<20)
	}
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: upstream})
	rp.ModifyResponse = func(resp *http.Response) error {
		resp.Body = &pacedBody{rc: resp.Body, limit: limit, count: &p.bytes, ctx: resp.Request.Context()}
		return nil
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.requests.Add(1)
		if p.rtt > 0 {
			select {
			case <-time.After(p.rtt):
			case <-r.Context().Done():
				return
			}
		}
		rp.ServeHTTP(w, r)
	})
	p.srv = &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

func (p *registryProxy) reset() { p.bytes.Store(0); p.requests.Store(0) }
func (p *registryProxy) close() { _ = p.srv.Close() }

type pacedBody struct {
	rc    io.ReadCloser
	limit *rate.Limiter
	count *atomic.Int64
	ctx   context.Context
}

func (b *pacedBody) Read(p []byte) (int, error) {
	if len(p) > 1<<20 {
		p = p[:1<<20]
	}
	n, err := b.rc.Read(p)
	if n > 0 {
		b.count.Add(int64(n))
		if b.limit != nil {
			if werr := b.limit.WaitN(b.ctx, n); werr != nil && err == nil {
				err = werr
			}
		}
	}
	return n, err
}

func (b *pacedBody) Close() error { return b.rc.Close() }

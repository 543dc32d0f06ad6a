package main

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/crane"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// The hot suite (hot slots follow demand): a mixed burst over
// five images with a skewed mix on the real containerd runtime, binds
// arriving continuously and released after a short hold so slots turn
// over; the same burst with hot slots off is the baseline. Sized by
// BENCH_HOT_BINDS (240), BENCH_HOT_RATE (binds per second, 2),
// BENCH_HOT_BUDGETS (hot budgets to run, comma-separated: 4,8,12),
// BENCH_HOT_SLOTS (20) and BENCH_HOT_WARM (warm slots, 4).

const hotNamespace = "sandman-bench-hot"

// hotMix is the share of binds per image, in percent.
var hotMixShares = []int{50, 25, 12, 8, 5}

type hotArrival struct {
	at    time.Duration // after the burst's start
	image int
	hold  time.Duration
}

// hotSchedule is the burst: Poisson arrivals at rate per second, images
// drawn from hotMixShares, holds uniform in [1 s, 3 s); seeded, so every
// run binds the same sequence.
func hotSchedule(n int, rate float64) []hotArrival {
	rng := rand.New(rand.NewPCG(16, 16))
	var out []hotArrival
	var at time.Duration
	for range n {
		at += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		p, img := rng.IntN(100), 0
		for acc := hotMixShares[0]; p >= acc; acc += hotMixShares[img] {
			img++
		}
		out = append(out, hotArrival{at: at, image: img, hold: time.Second + time.Duration(rng.Int64N(int64(2*time.Second)))})
	}
	return out
}

// hotRun is what one burst measured.
type hotRun struct {
	budget         int
	all, hot, gen  durations
	hotAfter50     int // binds after the first 50 that took a hot slot
	after50        int
	retries        int // binds refused for want of a slot, tried again
	pssPerHot      float64
	hotIdle        int
	cooldowns      float64
	takeovers      float64
	elapsed        time.Duration
	perImageHot    []int
	perImageAfter  []int
	startedPerBind float64
}

func benchHot(cfg config) ([]row, error) {
	be, closeEnv, err := openBenchEnv(cfg, hotNamespace)
	if err != nil {
		return nil, err
	}
	defer closeEnv()
	env := be.env
	ctx := namespaces.WithNamespace(context.Background(), hotNamespace)
	images, err := pushHotImages(env["REGISTRY"], env["BUSYBOX_IMAGE"], len(hotMixShares))
	if err != nil {
		return nil, fmt.Errorf("push the mix's images: %w", err)
	}
	n := envInt("BENCH_HOT_BINDS", 240)
	rate := float64(envInt("BENCH_HOT_RATE", 2))
	slots, warm := envInt("BENCH_HOT_SLOTS", 20), envInt("BENCH_HOT_WARM", 4)
	budgets := []int{4, 8, 12}
	if v := os.Getenv("BENCH_HOT_BUDGETS"); v != "" {
		budgets = nil
		for _, f := range strings.Split(v, ",") {
			b, err := strconv.Atoi(f)
			if err != nil || b <= 0 {
				return nil, fmt.Errorf("BENCH_HOT_BUDGETS %q: want positive counts", v)
			}
			budgets = append(budgets, b)
		}
	}
	sched := hotSchedule(n, rate)
	var runs []hotRun
	for _, budget := range append([]int{0}, budgets...) {
		fmt.Fprintf(os.Stderr, "hot: burst of %d binds at %.0f/s, hot budget %d\n", n, rate, budget)
		r, err := be.hotBurst(ctx, sched, images, slots, warm, budget)
		if err != nil {
			return nil, fmt.Errorf("hot budget %d: %w", budget, err)
		}
		runs = append(runs, r)
	}
	base := runs[0]
	setup := fmt.Sprintf("%d binds at %.0f/s over 5 images (%v %%), held 1–3 s, %d slots, %d warm", n, rate, hotMixShares, slots, warm)
	rows := []row{{
		name: "mixed burst, hot slots off (baseline): bind", n: len(base.all), p50: ms(base.all.p50()), p99: ms(base.all.p99()),
		baseline: "-", ratio: "1.00×", note: setup + fmt.Sprintf("; %d retries for want of a slot", base.retries),
	}}
	for _, r := range runs[1:] {
		share := 100 * float64(r.hotAfter50) / float64(max(r.after50, 1))
		var perImage []string
		for i := range r.perImageAfter {
			perImage = append(perImage, fmt.Sprintf("%d/%d", r.perImageHot[i], r.perImageAfter[i]))
		}
		rows = append(rows,
			row{name: fmt.Sprintf("mixed burst, hot budget %d: bind, every path", r.budget), n: len(r.all), p50: ms(r.all.p50()), p99: ms(r.all.p99()),
				baseline: "hot slots off", ratio: ratio(r.all.p50(), base.all.p50()),
				note: fmt.Sprintf("**%.1f %% of the binds after the first 50 on hot slots** (target ≥ 80 %%; per image, most bound first: %s); %.2f hot starts per bind; %.0f cool-downs, %.0f takeovers, %d retries",
					share, strings.Join(perImage, ", "), r.startedPerBind, r.cooldowns, r.takeovers, r.retries)},
			row{name: fmt.Sprintf("mixed burst, hot budget %d: bind, hot path", r.budget), n: len(r.hot), p50: ms(r.hot.p50()), p99: ms(r.hot.p99()),
				baseline: "hot slots off", ratio: ratio(r.hot.p50(), base.all.p50())},
			row{name: fmt.Sprintf("mixed burst, hot budget %d: bind, generic path", r.budget), n: len(r.gen), p50: ms(r.gen.p50()), p99: ms(r.gen.p99()),
				baseline: "hot slots off", ratio: ratio(r.gen.p50(), base.all.p50())},
		)
		if r.hotIdle > 0 {
			rows = append(rows, row{name: fmt.Sprintf("host memory per idle hot sandbox, budget %d", r.budget), n: r.hotIdle,
				p50: fmt.Sprintf("%.1f MB", r.pssPerHot/1e6), p99: "-", baseline: "-", ratio: "-",
				note: "PSS of its shim + daemon after the burst, the pool at its targets"})
		}
	}
	return rows, nil
}

// pushHotImages pushes n images to the local registry, each the busybox
// image with a tiny layer of its own (so each is a distinct image to the
// node), and returns their references.
func pushHotImages(registry, busybox string, n int) ([]string, error) {
	base, err := crane.Pull(busybox, crane.Insecure)
	if err != nil {
		return nil, err
	}
	var refs []string
	for i := range n {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		body := []byte("bench-hot image " + strconv.Itoa(i) + "\n")
		if err := tw.WriteHeader(&tar.Header{Name: "etc/bench-hot", Mode: 0o644, Size: int64(len(body)), ModTime: time.Unix(0, 0)}); err != nil {
			return nil, err
		}
		_, _ = tw.Write(body)
		if err := tw.Close(); err != nil {
			return nil, err
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil },
			tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return nil, err
		}
		img, err := mutate.Append(base, mutate.Addendum{Layer: layer, MediaType: types.OCILayer})
		if err != nil {
			return nil, err
		}
		ref := fmt.Sprintf("%s/sandman/bench-hot-%d:1", registry, i)
		if err := crane.Push(img, ref, crane.Insecure); err != nil {
			return nil, err
		}
		refs = append(refs, ref)
	}
	return refs, nil
}

// hotBurst runs the burst on a runtime of its own with the given hot
// budget (0: off).
func (b benchEnv) hotBurst(ctx context.Context, sched []hotArrival, images []string, slots, warm, budget int) (hotRun, error) {
	res := hotRun{budget: budget, perImageHot: make([]int, len(images)), perImageAfter: make([]int, len(images))}
	rt, stop, err := b.startRuntime(ctx, "bench-hot-"+strconv.Itoa(budget), func(c *noderuntime.Config) {
		c.Slots, c.WarmSlots, c.HotSlots, c.PrePull = slots, warm, budget, images
	})
	if err != nil {
		return res, err
	}
	defer stop()
	// The images unpacked and the warm slots made: neither is measured.
	deadline := time.Now().Add(5 * time.Minute)
	for {
		inv, err := rt.Inventory(ctx)
		if err != nil {
			return res, err
		}
		ready := 0
		for _, img := range images {
			if slices.Contains(inv.ReadyImages, img) {
				ready++
			}
		}
		if ready == len(images) && inv.Count()[runtime.StateWarm] >= warm {
			break
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("images ready %d of %d, slots %v", ready, len(images), inv.Count())
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The path of each bind, from the slot events: a bind that takes a
	// slot last seen hot with its image took the hot path.
	wctx, cancelWatch := context.WithCancel(ctx)
	defer cancelWatch()
	inv, events, err := rt.Watch(wctx)
	if err != nil {
		return res, err
	}
	type seen struct {
		state runtime.SlotState
		image string
	}
	last := map[string]seen{}
	for _, s := range inv.Slots {
		last[s.ID] = seen{s.State, s.Image}
	}
	var mu sync.Mutex
	hotPath := map[string]bool{}
	hotStarts := 0
	go func() {
		for ev := range events {
			if ev.Type != runtime.EventSlot {
				continue
			}
			s := ev.Slot
			prev := last[s.ID]
			mu.Lock()
			if s.State == runtime.StateBinding && s.Pod != nil {
				hotPath[s.Pod.UID] = prev.state == runtime.StateHot && prev.image == s.Image
			}
			if s.State == runtime.StateHot {
				hotStarts++
			}
			mu.Unlock()
			last[s.ID] = seen{s.State, s.Image}
		}
	}()
	lat := make([]time.Duration, len(sched))
	var wg sync.WaitGroup
	var errMu sync.Mutex
	var errs []error
	retries := 0
	start := time.Now()
	for i, a := range sched {
		time.Sleep(time.Until(start.Add(a.at)))
		wg.Go(func() {
			uid := "hot-" + strconv.Itoa(budget) + "-" + strconv.Itoa(i)
			for {
				t := time.Now()
				_, err := rt.Bind(ctx, runtimetest.Request(uid, images[a.image]))
				if errdefs.IsResourceExhausted(err) {
					errMu.Lock()
					retries++
					errMu.Unlock()
					time.Sleep(20 * time.Millisecond)
					continue
				}
				if err != nil {
					errMu.Lock()
					errs = append(errs, fmt.Errorf("bind %s: %w", uid, err))
					errMu.Unlock()
					return
				}
				lat[i] = time.Since(t)
				break
			}
			time.Sleep(a.hold)
			if err := rt.Release(ctx, uid, 0); err != nil {
				errMu.Lock()
				errs = append(errs, err)
				errMu.Unlock()
			}
		})
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	res.retries = retries
	if len(errs) > 0 {
		return res, errs[0]
	}
	for deadline := time.Now().Add(30 * time.Second); ; {
		mu.Lock()
		done := len(hotPath) == len(sched)
		mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("the paths of %d binds not seen", len(sched)-len(hotPath))
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	for i, a := range sched {
		hot := hotPath["hot-"+strconv.Itoa(budget)+"-"+strconv.Itoa(i)]
		res.all = append(res.all, lat[i])
		if hot {
			res.hot = append(res.hot, lat[i])
		} else {
			res.gen = append(res.gen, lat[i])
		}
		if i >= 50 {
			res.after50++
			res.perImageAfter[a.image]++
			if hot {
				res.hotAfter50++
				res.perImageHot[a.image]++
			}
		}
	}
	res.startedPerBind = float64(hotStarts) / float64(len(sched))
	mu.Unlock()
	reg := prometheus.NewRegistry()
	reg.MustRegister(rt.Collector())
	if families, err := reg.Gather(); err == nil {
		for _, f := range families {
			for _, m := range f.GetMetric() {
				switch f.GetName() {
				case "sandman_node_hot_cooldowns_total":
					res.cooldowns = m.GetCounter().GetValue()
				case "sandman_node_hot_takeovers_total":
					res.takeovers = m.GetCounter().GetValue()
				}
			}
		}
	}
	if budget > 0 {
		// Memory of the idle hot pool: once nothing is bound and the
		// pool has not changed for 2 s.
		prev, since := -1, time.Now()
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			inv, err := rt.Inventory(ctx)
			if err != nil {
				return res, err
			}
			c := inv.Count()
			h := c[runtime.StateHot]
			if h != prev || c[runtime.StateBinding]+c[runtime.StateBound]+c[runtime.StateReleasing] > 0 {
				prev, since = h, time.Now()
				continue
			}
			if time.Since(since) > 2*time.Second {
				break
			}
		}
		time.Sleep(2 * time.Second) // let them settle before reading memory
		pss, _, err := sandboxPSS(hotNamespace)
		if err != nil {
			return res, err
		}
		if prev > 0 {
			res.hotIdle, res.pssPerHot = prev, pss/float64(prev)
		}
	}
	return res, nil
}

package main

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"golang.org/x/sync/errgroup"
	coordv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/fake"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// Scale suite sizes; BENCH_SCALE_* override them (a quick run:
// BENCH_SCALE_HOLD=2000 BENCH_SCALE_SCHED=500 BENCH_SCALE_REAL_MAX=50).
var (
	scaleNodes     = envInt("BENCH_SCALE_NODES", 50)
	scaleSlots     = envInt("BENCH_SCALE_SLOTS", 400)
	scaleHold      = envInt("BENCH_SCALE_HOLD", 20000)
	scaleBurst     = envInt("BENCH_SCALE_BURST", 1000)
	scaleRepeats   = envInt("BENCH_SCALE_REPEATS", 3)
	scaleSched     = envInt("BENCH_SCALE_SCHED", 5000)
	scaleSchedNode = envInt("BENCH_SCALE_SCHED_NODES", 200)
	scaleRealBurst = envInt("BENCH_SCALE_REAL_BURST", 100)
	scaleRealMax   = envInt("BENCH_SCALE_REAL_MAX", 500)
)

// scalePart: BENCH_SCALE_ONLY (comma-separated: hold, bursts, sched, oversub, real)
// runs only those parts; empty runs all.
func scalePart(name string) bool {
	only := os.Getenv("BENCH_SCALE_ONLY")
	return only == "" || slices.Contains(strings.Split(only, ","), name)
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// benchScale: 20,000 concurrent sandboxes held on runtime/fake agents,
// repeated bursts of 1,000 (node selector and spec.nodeName preset),
// kube-scheduler's load for the virtual node beside 200 ordinary nodes, and
// real containers: a burst of 100 and as many idle sandboxes as the machine
// holds. Everything runs against the stack's real control plane; the fake
// agents are served from this process over the node API, sandman-vk is its
// own process.
func benchScale(cfg config) ([]row, error) {
	stack, err := framework.Load(cfg.root)
	if err != nil {
		return nil, err
	}
	env := stack.Env
	rc := rest.CopyConfig(stack.RESTConfig)
	rc.QPS, rc.Burst = 5000, 10000
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp("", "sandman-bench-scale")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	vkBin := filepath.Join(tmp, "sandman-vk")
	build := exec.Command("go", "build", "-o", vkBin, "./cmd/sandman-vk")
	build.Dir = cfg.root
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build sandman-vk: %v\n%s", err, out)
	}
	daemonBin, err := buildDaemon(cfg.root, tmp)
	if err != nil {
		return nil, err
	}
	client, err := stack.NewContainerd(benchNamespace)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	b := &vkBench{env: env, kube: kube, vkBin: vkBin, tmp: tmp, ns: "scale-" + rand.String(5), client: client,
		be: benchEnv{client: client, env: env, daemonBin: daemonBin}}
	ctx := namespaces.WithNamespace(context.Background(), benchNamespace)
	b.removeLeftovers(ctx)
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: b.ns}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	defer func() { _ = kube.CoreV1().Namespaces().Delete(context.Background(), b.ns, metav1.DeleteOptions{}) }()
	image := env["BUSYBOX_IMAGE"]

	agents := map[string]runtime.Runtime{}
	for i := range scaleNodes {
		name := fmt.Sprintf("scale-%02d", i)
		f, err := fake.New(fake.Config{Node: name, Slots: scaleSlots, IPBase: fmt.Sprintf("10.%d.%d", 100+i/250, i%250),
			BindLatency: 20 * time.Millisecond, ReadyLatency: 5 * time.Millisecond, Resources: runtime.Resources{MilliCPU: 1 << 40, MemoryBytes: 1 << 50}})
		if err != nil {
			return nil, err
		}
		defer f.Close()
		agents[name] = f
	}
	var rows []row
	plots := map[string]durations{}
	// Each part's rows are printed as soon as it ends, so a later failure
	// does not lose them.
	emit := func(r ...row) {
		rows = append(rows, r...)
		fmt.Fprint(os.Stderr, render(r))
	}

	// Hold 20,000.
	if scalePart("hold") {
		fmt.Fprintf(os.Stderr, "scale: holding %d sandboxes on %d fake nodes × %d slots\n", scaleHold, scaleNodes, scaleSlots)
		hold, err := b.burst(ctx, "hold", agents, image, scaleHold, false)
		if err != nil {
			return nil, fmt.Errorf("hold %d: %w", scaleHold, err)
		}
		warm := "every slot warm again"
		if !hold.allWarm {
			warm = "NOT every slot warm again"
		}
		name := fmt.Sprintf("hold %d concurrent sandboxes (%d fake nodes × %d slots, node selector): create → Ready", scaleHold, scaleNodes, scaleSlots)
		if limit := os.Getenv("BENCH_VK_GOMEMLIMIT"); limit != "" {
			name += ", sandman-vk with GOMEMLIMIT=" + limit
		}
		emit(row{name: name,
			n: scaleHold, p50: ms(hold.ready.p50()), p99: ms(hold.ready.p99()), baseline: "create call " + ms(hold.create.p50()), ratio: ratio(hold.ready.p50(), hold.create.p50()),
			note: fmt.Sprintf("all created in %.1f s, all Ready in %.1f s (%.0f pods/s); sandman-vk %.1f CPU-s, peak RSS %d MiB (target ≤ 1024); apiserver peak RSS %d MiB; etcd RSS %d MiB; %s; %s; delete all %.1f s, %s",
				hold.created.Seconds(), hold.total.Seconds(), float64(scaleHold)/hold.total.Seconds(), hold.vkCPU.Seconds(), hold.vkPeakRSS>>20,
				hold.apiPeakRSS>>20, hold.etcdRSS>>20, cpuProfile(hold), requestsPerPod(hold), hold.deleteAll.Seconds(), warm)})
		plots[fmt.Sprintf("hold %d", scaleHold)] = hold.ready
	}

	// Bursts of 1,000, repeated; medians.
	for _, preset := range []bool{false, true} {
		if !scalePart("bursts") {
			break
		}
		name := fmt.Sprintf("burst of %d (fake nodes), node selector", scaleBurst)
		if preset {
			name = fmt.Sprintf("burst of %d (fake nodes), spec.nodeName preset", scaleBurst)
		}
		var runs []burstResult
		for r := range scaleRepeats {
			fmt.Fprintf(os.Stderr, "scale: %s, run %d/%d\n", name, r+1, scaleRepeats)
			res, err := b.burst(ctx, fmt.Sprintf("b%d", r), agents, image, scaleBurst, preset)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			runs = append(runs, res)
		}
		emit(burstMedianRow(name, runs))
		all := durations{}
		for _, r := range runs {
			all = append(all, r.ready...)
		}
		plots[name] = all
	}

	// kube-scheduler: the virtual node beside 200 ordinary nodes.
	if scalePart("sched") {
		r, err := b.schedulerLoad(ctx, agents, image)
		if err != nil {
			return nil, fmt.Errorf("scheduler load: %w", err)
		}
		emit(r...)
	}

	// Bursts beyond capacity: the virtual node's modes beside ordinary nodes.
	if scalePart("oversub") {
		r, cdf, pending, err := b.oversubscribed(ctx, image)
		emit(r...)
		if len(cdf) > 0 {
			for _, plot := range []struct{ file, svg string }{
				{"oversub-create-to-ready.svg", cdfSVG(fmt.Sprintf("oversubscribed burst (%d + %d pods onto %d slots): create → Ready, cumulative", oversubA, oversubB, oversubSlots), cdf)},
				{"oversub-pending.svg", seriesSVG("oversubscribed burst: kube-scheduler's pending pods (scheduler_pending_pods, all queues)", "pending pods", pending)},
			} {
				if werr := os.WriteFile(filepath.Join(cfg.root, "docs", plot.file), []byte(plot.svg), 0o644); werr != nil {
					return rows, werr
				}
			}
		}
		if err != nil {
			return rows, err
		}
	}

	// Real containers.
	if scalePart("real") {
		r, err := b.realScale(ctx, image)
		if err != nil {
			return nil, fmt.Errorf("real sandboxes: %w", err)
		}
		emit(r...)
	}

	if len(plots) > 0 { // only when the parts that feed it ran
		svg := filepath.Join(cfg.root, "docs", "scale-create-to-ready.svg")
		if err := os.WriteFile(svg, []byte(cdfSVG("create → Ready, cumulative (fake nodes, real control plane)", plots)), 0o644); err != nil {
			return nil, err
		}
		fmt.Fprintf(os.Stderr, "scale: plot written to %s\n", svg)
	}
	return rows, nil
}

// cpuProfile says where the machine's CPU went during a burst: each
// process's CPU time per pod, and how busy the two cores were.
func cpuProfile(r burstResult) string {
	per := func(d time.Duration) float64 { return d.Seconds() * 1000 / float64(r.n) }
	sum := r.apiCPU + r.etcdCPU + r.schedCPU + r.kcmCPU + r.vkCPU + r.selfCPU
	busy := sum.Seconds() / (float64(goruntime.NumCPU()) * r.total.Seconds())
	return fmt.Sprintf("CPU ms per pod: apiserver %.1f, etcd %.1f, scheduler %.1f, controller-manager %.1f, sandman-vk %.1f, bench client + fake agents %.1f (cores %.0f%% busy)",
		per(r.apiCPU), per(r.etcdCPU), per(r.schedCPU), per(r.kcmCPU), per(r.vkCPU), per(r.selfCPU), busy*100)
}

// requestsPerPod summarises sandman-vk's apiserver requests per pod.
func requestsPerPod(r burstResult) string {
	var parts []string
	keys := slices.Sorted(maps.Keys(r.requests))
	total := 0.0
	for _, k := range keys {
		if r.requests[k] >= float64(r.n)/10 {
			parts = append(parts, fmt.Sprintf("%s %.2f", k, r.requests[k]/float64(r.n)))
		}
		total += r.requests[k]
	}
	return fmt.Sprintf("sandman-vk apiserver requests per pod %.2f (%s)", total/float64(r.n), strings.Join(parts, ", "))
}

// vkRequests reads sandman_vk_apiserver_requests_total from sandman-vk's
// metrics, by verb and resource.
func vkRequests(addr string) map[string]float64 {
	out := map[string]float64{}
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return out
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "sandman_vk_apiserver_requests_total{") {
			continue
		}
		labels, value, _ := strings.Cut(strings.TrimPrefix(line, "sandman_vk_apiserver_requests_total{"), "} ")
		var verb, res string
		for kv := range strings.SplitSeq(labels, ",") {
			k, v, _ := strings.Cut(kv, "=")
			v = strings.Trim(v, `"`)
			switch k {
			case "verb":
				verb = v
			case "resource":
				res = v
			}
		}
		f, _ := strconv.ParseFloat(value, 64)
		out[verb+" "+res] += f
	}
	return out
}

func burstMedianRow(name string, runs []burstResult) row {
	med := func(f func(burstResult) float64) float64 {
		v := make([]float64, len(runs))
		for i, r := range runs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	p50 := time.Duration(med(func(r burstResult) float64 { return float64(r.ready.p50()) }))
	p99 := time.Duration(med(func(r burstResult) float64 { return float64(r.ready.p99()) }))
	create := time.Duration(med(func(r burstResult) float64 { return float64(r.create.p50()) }))
	rate := med(func(r burstResult) float64 { return float64(r.n) / r.total.Seconds() })
	var rates []string
	for _, r := range runs {
		rates = append(rates, fmt.Sprintf("%.0f", float64(r.n)/r.total.Seconds()))
	}
	mid := runs[len(runs)/2]
	return row{name: name + ": create → Ready (median of runs)", n: runs[0].n * len(runs), p50: ms(p50), p99: ms(p99),
		baseline: "create call " + ms(create), ratio: ratio(p50, create),
		note: fmt.Sprintf("%.0f pods/s to all Ready (runs: %s; target ≥ 300, p99 ≤ 5 s); %s; %s",
			rate, strings.Join(rates, ", "), cpuProfile(mid), requestsPerPod(mid))}
}

// schedulerLoad schedules the same number of pods onto the virtual node and
// onto 200 ordinary Node objects (kept Ready by renewing their leases, their
// pods made Running by a stand-in for kubelets), and compares
// kube-scheduler's CPU time and throughput.
func (b *vkBench) schedulerLoad(ctx context.Context, agents map[string]runtime.Runtime, image string) ([]row, error) {
	schedPID := pidOf(b.env["SANDMAN_STATE"], "kube-scheduler")
	if schedPID == 0 {
		return nil, fmt.Errorf("no kube-scheduler pid")
	}
	n := scaleSched

	// The virtual node.
	fmt.Fprintf(os.Stderr, "scale: scheduler, %d pods onto the virtual node\n", n)
	vres, err := b.burst(ctx, "sched-vk", agents, image, n, false)
	if err != nil {
		return nil, err
	}
	vSched := vres.schedCPU

	// 200 ordinary nodes.
	fmt.Fprintf(os.Stderr, "scale: scheduler, %d pods over %d ordinary nodes\n", n, scaleSchedNode)
	label := "sandman-bench-sched-" + rand.String(4)
	nodes, stopNodes, err := b.fakeKubelets(ctx, label, scaleSchedNode, n/scaleSchedNode+10)
	if err != nil {
		return nil, err
	}
	defer stopNodes()
	rw, err := b.watchReady(ctx)
	if err != nil {
		return nil, err
	}
	defer rw.stop()
	cpu0 := cpuTime(schedPID)
	names := make([]string, n)
	starts := make([]time.Time, n)
	var g errgroup.Group
	g.SetLimit(64)
	begin := time.Now()
	for i := range n {
		names[i] = fmt.Sprintf("plain-%05d", i)
		g.Go(func() error {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: names[i], Namespace: b.ns},
				Spec: corev1.PodSpec{
					NodeSelector:                  map[string]string{label: "true"},
					TerminationGracePeriodSeconds: ptr.To[int64](0),
					Containers: []corev1.Container{{Name: "task", Image: image, Resources: corev1.ResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")}}}},
				},
			}
			starts[i] = time.Now()
			_, err := b.kube.CoreV1().Pods(b.ns).Create(ctx, pod, metav1.CreateOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	at, err := rw.waitScheduled(names, 10*time.Minute)
	if err != nil {
		return nil, err
	}
	last := begin
	for _, name := range names {
		if at[name].After(last) {
			last = at[name]
		}
	}
	plainTotal := last.Sub(begin)
	plainSched := cpuTime(schedPID) - cpu0
	if _, err := rw.wait(names, 10*time.Minute); err != nil {
		return nil, fmt.Errorf("stand-in kubelets: %w", err)
	}
	if err := b.kube.CoreV1().Pods(b.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{}); err != nil {
		return nil, err
	}
	if err := b.waitGone(ctx, names); err != nil {
		return nil, err
	}
	_ = nodes

	// The virtual node's scheduling throughput: first create to last bound.
	vRate := float64(n) / vres.total.Seconds()
	perPodV := vSched.Seconds() * 1000 / float64(n)
	perPodP := plainSched.Seconds() * 1000 / float64(n)
	return []row{
		{name: fmt.Sprintf("kube-scheduler: %d pods over %d ordinary nodes (baseline)", n, scaleSchedNode), n: n,
			p50: fmt.Sprintf("%.3f ms CPU/pod", perPodP), p99: "-", baseline: "-", ratio: "1.00×",
			note: fmt.Sprintf("scheduler %.1f CPU-s; %.0f pods/s scheduled (all bound in %.1f s); pods made Running by a stand-in for kubelets", plainSched.Seconds(), float64(n)/plainTotal.Seconds(), plainTotal.Seconds())},
		{name: fmt.Sprintf("kube-scheduler: %d pods onto the virtual node", n), n: n,
			p50: fmt.Sprintf("%.3f ms CPU/pod", perPodV), p99: "-", baseline: fmt.Sprintf("%d ordinary nodes", scaleSchedNode),
			ratio: fmt.Sprintf("%.2f×", perPodV/perPodP),
			note:  fmt.Sprintf("scheduler %.1f CPU-s (target ≤ 0.5× the baseline); %.0f pods/s to Ready through sandman-vk", vSched.Seconds(), vRate)},
	}, nil
}

// fakeKubelets makes count Ready nodes with room for perNode pods each, renews
// their leases, and makes their pods Running and Ready as a kubelet would
// report them. stop deletes them.
func (b *vkBench) fakeKubelets(ctx context.Context, label string, count, perNode int) ([]string, func(), error) {
	var names []string
	lctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	stop := func() {
		cancel()
		wg.Wait()
		for _, name := range names {
			_ = b.kube.CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{})
			_ = b.kube.CoordinationV1().Leases("kube-node-lease").Delete(context.Background(), name, metav1.DeleteOptions{})
		}
	}
	fail := func(err error) ([]string, func(), error) {
		stop()
		return nil, nil, err
	}
	for i := range count {
		names = append(names, fmt.Sprintf("%s-%03d", label, i))
	}
	// The leases are renewed from the start: created one after another on a
	// loaded machine, the last of 1,000 nodes came more than 40 s after the
	// first, whose lease had lapsed by then; the node lifecycle controller
	// marked those nodes' Ready condition Unknown and tainted them, and only a
	// kubelet's status write takes that back (the mode failed with its nodes
	// "still tainted" after 2 minutes).
	wg.Go(func() { // leases every 10 s
		t := time.NewTicker(10 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-lctx.Done():
				return
			case <-t.C:
			}
			// 32 at a time: one after another, 1,000 renewals fell behind
			// the 40 s lease on a loaded machine, and the node lifecycle
			// controller tainted the nodes mid-run.
			var renew errgroup.Group
			renew.SetLimit(32)
			for _, name := range names {
				renew.Go(func() error {
					l, err := b.kube.CoordinationV1().Leases("kube-node-lease").Get(lctx, name, metav1.GetOptions{})
					if err != nil {
						return nil
					}
					l.Spec.RenewTime = &metav1.MicroTime{Time: time.Now()}
					_, _ = b.kube.CoordinationV1().Leases("kube-node-lease").Update(lctx, l, metav1.UpdateOptions{})
					return nil
				})
			}
			_ = renew.Wait()
		}
	})
	// Created 16 at a time: the nodes are ready for pods sooner, so the
	// leases matter less.
	var mk errgroup.Group
	mk.SetLimit(16)
	for i, name := range names {
		mk.Go(func() error {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{label: "true", "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}}}
			if _, err := b.kube.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{}); err != nil {
				return err
			}
			capa := corev1.ResourceList{corev1.ResourcePods: *resource.NewQuantity(int64(perNode), resource.DecimalSI),
				corev1.ResourceCPU: resource.MustParse("64"), corev1.ResourceMemory: resource.MustParse("256Gi")}
			// The node lifecycle controller edits new nodes too: retry on conflict.
			err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
				cur, err := b.kube.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					return err
				}
				now := metav1.Now()
				cur.Status = corev1.NodeStatus{Capacity: capa, Allocatable: capa,
					Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastHeartbeatTime: now, LastTransitionTime: now}},
					Addresses:  []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: fmt.Sprintf("10.254.%d.%d", i/250, i%250+1)}}}
				_, err = b.kube.CoreV1().Nodes().UpdateStatus(ctx, cur, metav1.UpdateOptions{})
				return err
			})
			if err != nil {
				return err
			}
			lease := &coordv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "kube-node-lease"},
				Spec: coordv1.LeaseSpec{HolderIdentity: ptr.To(name), LeaseDurationSeconds: ptr.To[int32](40), RenewTime: &metav1.MicroTime{Time: time.Now()}}}
			if _, err := b.kube.CoordinationV1().Leases("kube-node-lease").Create(ctx, lease, metav1.CreateOptions{}); err != nil {
				return err
			}
			return nil
		})
	}
	if err := mk.Wait(); err != nil {
		return fail(err)
	}
	wg.Go(func() { b.standInKubelet(lctx, label) })
	// Wait until the node lifecycle controller has lifted the not-ready
	// taints, so every node takes pods.
	deadline := time.Now().Add(2 * time.Minute)
	for {
		l, err := b.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: label + "=true"})
		tainted, listed, keys := 0, 0, map[string]int{}
		if err == nil {
			listed = len(l.Items)
			for _, n := range l.Items {
				if len(n.Spec.Taints) > 0 {
					tainted++
				}
				for _, t := range n.Spec.Taints {
					keys[t.Key+":"+string(t.Effect)]++
				}
			}
			if tainted == 0 && listed == count {
				break
			}
		}
		if time.Now().After(deadline) {
			return fail(fmt.Errorf("ordinary nodes not ready for pods after 2m: %d of %d listed, %d tainted (%v), last list error %v", listed, count, tainted, keys, err))
		}
		time.Sleep(200 * time.Millisecond)
	}
	return names, stop, nil
}

// standInKubelet marks pods bound to the label's nodes Running and Ready,
// through an informer (a plain watch may be closed by the apiserver when a
// burst outruns its reader; the informer resumes it).
func (b *vkBench) standInKubelet(ctx context.Context, label string) {
	prefix := label + "-"
	sem := make(chan struct{}, 32)
	var mu sync.Mutex
	done := map[string]bool{}
	factory := informers.NewSharedInformerFactoryWithOptions(b.kube, 0, informers.WithNamespace(b.ns))
	inf := factory.Core().V1().Pods().Informer()
	see := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok || !strings.HasPrefix(pod.Spec.NodeName, prefix) || pod.Status.Phase == corev1.PodRunning || pod.DeletionTimestamp != nil {
			return
		}
		mu.Lock()
		if done[pod.Name] {
			mu.Unlock()
			return
		}
		done[pod.Name] = true
		mu.Unlock()
		go func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			err := retry.OnError(retry.DefaultBackoff, func(error) bool { return ctx.Err() == nil }, func() error {
				cur, err := b.kube.CoreV1().Pods(b.ns).Get(ctx, pod.Name, metav1.GetOptions{})
				if err != nil || cur.Status.Phase == corev1.PodRunning {
					return err
				}
				return b.markRunning(ctx, cur)
			})
			if err != nil {
				mu.Lock()
				delete(done, pod.Name) // the next update tries again
				mu.Unlock()
			}
		}()
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: see, UpdateFunc: func(_, cur any) { see(cur) }}); err != nil {
		return
	}
	factory.Start(ctx.Done())
	<-ctx.Done()
	factory.Shutdown()
}

// markRunning reports pod Running and Ready, as its kubelet would.
func (b *vkBench) markRunning(ctx context.Context, pod *corev1.Pod) error {
	now := metav1.Now()
	pod.Status.Phase = corev1.PodRunning
	pod.Status.StartTime = &now
	pod.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
	}
	pod.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "task", Ready: true, Image: pod.Spec.Containers[0].Image,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}}
	_, err := b.kube.CoreV1().Pods(b.ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{})
	return err
}

// realScale: a burst of real sandboxes through the whole path, and as many
// idle real sandboxes as the machine holds (binds on the node agent until
// one fails, host memory runs low or the run's cap), with host memory per
// sandbox.
func (b *vkBench) realScale(ctx context.Context, image string) ([]row, error) {
	slots := max(scaleRealBurst, scaleRealMax)
	warmSlots := min(16, slots)
	rt, stop, err := b.be.startRuntime(ctx, "bench-scale-real", func(c *noderuntime.Config) {
		c.Slots, c.WarmSlots, c.RefillConcurrency = slots, warmSlots, 2
	})
	if err != nil {
		return nil, err
	}
	defer stop()
	if err := waitCount(ctx, rt, runtime.StateWarm, warmSlots); err != nil {
		return nil, err
	}
	fmt.Fprintf(os.Stderr, "scale: burst of %d real sandboxes\n", scaleRealBurst)
	res, err := b.burst(ctx, "real", map[string]runtime.Runtime{"bench-scale-real": rt}, image, scaleRealBurst, false)
	if err != nil {
		return nil, err
	}
	rows := []row{{name: fmt.Sprintf("burst of %d real sandboxes (one node agent, containerd): create → Ready", scaleRealBurst), n: scaleRealBurst,
		p50: ms(res.ready.p50()), p99: ms(res.ready.p99()), baseline: "create call " + ms(res.create.p50()), ratio: ratio(res.ready.p50(), res.create.p50()),
		note: fmt.Sprintf("%.1f pods/s to all Ready (%.1f s); sandman-vk %.1f CPU-s", float64(res.n)/res.total.Seconds(), res.total.Seconds(), res.vkCPU.Seconds())}}

	fmt.Fprintf(os.Stderr, "scale: idle real sandboxes, up to %d\n", scaleRealMax)
	if err := waitCount(ctx, rt, runtime.StateWarm, warmSlots); err != nil {
		return nil, err
	}
	before := memAvailable()
	held, why := 0, fmt.Sprintf("the run's cap (%d)", scaleRealMax)
	start := time.Now()
	for held < scaleRealMax {
		if memAvailable() < 2<<30 {
			why = "host memory below 2 GiB available"
			break
		}
		_, err := rt.Bind(ctx, runtimetest.Request(fmt.Sprintf("idle-%05d", held), image))
		if err != nil {
			why = "a bind failed: " + err.Error()
			break
		}
		held++
	}
	// Let the last sandboxes settle before reading memory.
	if err := waitCount(ctx, rt, runtime.StateBound, held); err != nil {
		return nil, err
	}
	used := before - memAvailable()
	pss, _, _ := sandboxPSS(benchNamespace)
	took := time.Since(start)
	for i := range held {
		_ = rt.Release(ctx, fmt.Sprintf("idle-%05d", i), 0)
	}
	rows = append(rows, row{name: "idle real sandboxes held at once (busybox, daemon as PID 1)", n: held,
		p50: fmt.Sprintf("%.1f MiB/sandbox", float64(used)/float64(max(held, 1))/(1<<20)), p99: "-", baseline: "-", ratio: "-",
		note: fmt.Sprintf("%d held, stopped by %s; host MemAvailable fell by %.2f GiB (kernel memory included); PSS of their shims and processes %.1f MiB per sandbox; bound one after another in %.0f s",
			held, why, float64(used)/(1<<30), pss/float64(max(held, 1))/(1<<20), took.Seconds())})
	return rows, nil
}

// memAvailable is /proc/meminfo's MemAvailable in bytes.
func memAvailable() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n << 10
		}
	}
	return 0
}

// removeLeftovers deletes what an interrupted run left: bench nodes and
// their leases, scale namespaces.
func (b *vkBench) removeLeftovers(ctx context.Context) {
	if l, err := b.kube.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); err == nil {
		for _, n := range l.Items {
			if strings.HasPrefix(n.Name, "sandman-bench-") {
				_ = b.kube.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{})
				_ = b.kube.CoordinationV1().Leases("kube-node-lease").Delete(ctx, n.Name, metav1.DeleteOptions{})
			}
		}
	}
	if l, err := b.kube.CoreV1().Namespaces().List(ctx, metav1.ListOptions{}); err == nil {
		for _, ns := range l.Items {
			if strings.HasPrefix(ns.Name, "scale-") && ns.Name != b.ns {
				_ = b.kube.CoreV1().Pods(ns.Name).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{})
				_ = b.kube.CoreV1().Namespaces().Delete(ctx, ns.Name, metav1.DeleteOptions{})
			}
		}
	}
}

package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	daemonapi "github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/fake"
	"github.com/sandman-dev/sandman/runtime/nodeapi"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

const benchToken = "bench-pool-token"

// vkBench is the full path: apiserver, scheduler, sandman-vk (a process,
// so its CPU and memory can be read), node agents served over the node API
// from this process, containerd or runtime/fake behind them.
type vkBench struct {
	env    map[string]string
	kube   kubernetes.Interface
	vkBin  string
	tmp    string
	ns     string
	client *ctrd.Client
	be     benchEnv

	schedOnce sync.Once
	sched     *http.Client // kube-scheduler's /metrics, see schedulerMetric
}

// benchVK measures create→Ready through the whole path.
func benchVK(cfg config) ([]row, error) {
	b, ctx, done, err := newVKBench(cfg, "sandman-bench-vk")
	if err != nil {
		return nil, err
	}
	defer done()
	env := b.env
	image := env["BUSYBOX_IMAGE"]
	n := min(cfg.n, 40)
	var rows []row

	// Generic warm slots.
	if os.Getenv("BENCH_VK_SKIP_SINGLE") == "" {
		rt, stop, err := b.be.startRuntime(ctx, "bench-vk-generic", func(c *noderuntime.Config) { c.Slots, c.WarmSlots = 8, 4 })
		if err != nil {
			return nil, err
		}
		res, err := b.single(ctx, "generic", rt, image, n, runtime.StateWarm, 4)
		stop()
		if err != nil {
			return nil, fmt.Errorf("generic: %w", err)
		}
		rows = append(rows, res.rows("generic warm slot", "target p50 ≤ 300 ms")...)
	}
	// Hot slots.
	if os.Getenv("BENCH_VK_SKIP_SINGLE") == "" {
		rt, stop, err := b.be.startRuntime(ctx, "bench-vk-hot", func(c *noderuntime.Config) {
			c.Slots, c.WarmSlots, c.HotSlots, c.HotImages = 6, 1, 3, []string{image}
		})
		if err != nil {
			return nil, err
		}
		res, err := b.single(ctx, "hot", rt, image, min(n, 30), runtime.StateHot, 3)
		stop()
		if err != nil {
			return nil, fmt.Errorf("hot: %w", err)
		}
		rows = append(rows, res.rows("hot slot", "target p50 ≤ 40 ms, p99 ≤ 100 ms")...)
	}
	// kubectl exec beside the daemon's own exec.
	if os.Getenv("BENCH_VK_SKIP_SINGLE") == "" {
		r, err := b.execLatency(ctx, image, n)
		if err != nil {
			return nil, fmt.Errorf("exec latency: %w", err)
		}
		rows = append(rows, r...)
	}
	if os.Getenv("BENCH_VK_SINGLE_ONLY") != "" {
		return rows, nil
	}
	// A burst of 100 real sandboxes.
	{
		rt, stop, err := b.be.startRuntime(ctx, "bench-vk-burst", func(c *noderuntime.Config) { c.Slots, c.WarmSlots = 100, 16 })
		if err != nil {
			return nil, err
		}
		if err := waitCount(ctx, rt, runtime.StateWarm, 16); err != nil {
			stop()
			return nil, err
		}
		size := 100
		if v, err := strconv.Atoi(os.Getenv("BENCH_VK_REAL_BURST")); err == nil {
			size = v
		}
		res, err := b.burst(ctx, "real", map[string]runtime.Runtime{"bench-vk-burst": rt}, image, size, false)
		stop()
		if err != nil {
			return nil, fmt.Errorf("burst of 100: %w", err)
		}
		rows = append(rows, res.rows("burst of 100 real sandboxes")...)
	}
	// A burst of 1,000 on runtime/fake nodes: 10 agents × 120 slots.
	{
		agents := map[string]runtime.Runtime{}
		for i := range 10 {
			name := fmt.Sprintf("fake-%02d", i)
			f, err := fake.New(fake.Config{Node: name, Slots: 120, IPBase: fmt.Sprintf("10.251.%d", i),
				BindLatency: 20 * time.Millisecond, ReadyLatency: 5 * time.Millisecond})
			if err != nil {
				return nil, err
			}
			defer f.Close()
			agents[name] = f
		}
		for _, preset := range []bool{false, true} {
			name := "burst of 1,000 on fake nodes, node selector"
			if preset {
				name = "burst of 1,000 on fake nodes, spec.nodeName preset"
			}
			res, err := b.burst(ctx, "fake", agents, image, 1000, preset)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", name, err)
			}
			rows = append(rows, res.rows(name)...)
		}
	}
	return rows, nil
}

// newVKBench connects to the stack, builds sandman-vk and the daemon into a
// temp dir, and makes a namespace for the bench's pods; done undoes it.
func newVKBench(cfg config, tmpPrefix string) (_ *vkBench, _ context.Context, done func(), retErr error) {
	stack, err := framework.Load(cfg.root)
	if err != nil {
		return nil, nil, nil, err
	}
	env := stack.Env
	rc := rest.CopyConfig(stack.RESTConfig)
	rc.QPS, rc.Burst = 2000, 4000
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, nil, nil, err
	}
	tmp, err := os.MkdirTemp("", tmpPrefix)
	if err != nil {
		return nil, nil, nil, err
	}
	var undo []func()
	done = func() {
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
	}
	defer func() {
		if retErr != nil {
			done()
		}
	}()
	undo = append(undo, func() { _ = os.RemoveAll(tmp) })
	daemonBin, err := buildDaemon(cfg.root, tmp)
	if err != nil {
		return nil, nil, nil, err
	}
	vkBin := filepath.Join(tmp, "sandman-vk")
	build := exec.Command("go", "build", "-o", vkBin, "./cmd/sandman-vk")
	build.Dir = cfg.root
	if out, err := build.CombinedOutput(); err != nil {
		return nil, nil, nil, fmt.Errorf("build sandman-vk: %v\n%s", err, out)
	}
	client, err := stack.NewContainerd(benchNamespace)
	if err != nil {
		return nil, nil, nil, err
	}
	undo = append(undo, func() { _ = client.Close() })
	b := &vkBench{env: env, kube: kube, vkBin: vkBin, tmp: tmp, ns: "bench-" + rand.String(5), client: client,
		be: benchEnv{client: client, env: env, daemonBin: daemonBin}}
	ctx := namespaces.WithNamespace(context.Background(), benchNamespace)
	// The label admits the namespace to the deployed pool (deploy/overlays/local's
	// --allowed-namespace-selector); host-process pools admit every namespace.
	nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: b.ns, Labels: map[string]string{podcontract.PoolAccessLabelPrefix + "deployed": "true"}}}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, nsObj, metav1.CreateOptions{}); err != nil {
		return nil, nil, nil, err
	}
	undo = append(undo, func() { _ = kube.CoreV1().Namespaces().Delete(context.Background(), b.ns, metav1.DeleteOptions{}) })
	return b, ctx, done, nil
}

// serveAgents serves runtimes over the node API on loopback ports.
func serveAgents(ctx context.Context, agents map[string]runtime.Runtime) (string, func(), error) {
	var list []string
	var servers []*http.Server
	for name, rt := range agents {
		api, err := nodeapi.NewServer(nodeapi.ServerConfig{Runtime: rt, Token: benchToken})
		if err != nil {
			return "", nil, err
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", nil, err
		}
		srv := &http.Server{Handler: api.Handler(), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = srv.Serve(l) }()
		servers = append(servers, srv)
		list = append(list, name+"="+l.Addr().String())
	}
	return strings.Join(list, ","), func() {
		for _, s := range servers {
			_ = s.Close()
		}
	}, nil
}

// vkProc is a running sandman-vk.
type vkProc struct {
	cmd     *exec.Cmd
	out     bytes.Buffer
	node    string
	pool    string
	metrics string
}

func (b *vkBench) startVK(ctx context.Context, pool, agents string, extra ...string) (*vkProc, error) {
	p := &vkProc{node: "sandman-bench-" + pool, pool: pool}
	metrics, kubelet := freeAddr("127.0.0.1"), "127.0.0.1:0"
	p.metrics = metrics
	if slices.Contains(extra, "--tls-cert-file") {
		// With TLS the apiserver must reach the kubelet port at the node IP.
		kubelet = freeAddr(b.env["BRIDGE_IP"])
	}
	p.cmd = exec.Command(b.vkBin, append([]string{"--kubeconfig", b.env["KUBECONFIG"], "--pool", pool, "--node-name", p.node,
		"--node-ip", b.env["BRIDGE_IP"], "--kubelet-listen", kubelet, "--node-agents", agents,
		"--metrics-listen", metrics, "--log-level", "warn", "--debug-pprof"}, extra...)...)
	p.cmd.Env = append(os.Environ(), "SANDMAN_POOL_TOKEN="+benchToken)
	if limit := os.Getenv("BENCH_VK_GOMEMLIMIT"); limit != "" {
		// Go's soft memory limit for sandman-vk (e.g. 900MiB): the GC works
		// harder near it instead of letting the heap grow to twice the live set.
		p.cmd.Env = append(p.cmd.Env, "GOMEMLIMIT="+limit)
	}
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	if err := p.cmd.Start(); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(time.Minute)
	for {
		n, err := b.kube.CoreV1().Nodes().Get(ctx, p.node, metav1.GetOptions{})
		if err == nil && n.Status.Capacity.Pods().Value() > 0 {
			for _, c := range n.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					return p, nil
				}
			}
		}
		if time.Now().After(deadline) {
			p.stop(b.kube)
			return nil, fmt.Errorf("virtual node %s not ready: %s", p.node, p.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (p *vkProc) stop(kube kubernetes.Interface) {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { _ = p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
	}
	_ = kube.CoreV1().Nodes().Delete(context.Background(), p.node, metav1.DeleteOptions{})
	if dir := os.Getenv("BENCH_VK_LOG_DIR"); dir != "" {
		// sandman-vk's output, kept for reading after the run.
		_ = os.WriteFile(filepath.Join(dir, p.node+".log"), p.out.Bytes(), 0o644)
	}
}

func (b *vkBench) pod(name, pool, image, nodeName string) *corev1.Pod {
	sum := sha256.Sum256([]byte("bench"))
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: b.ns,
			Annotations: map[string]string{podcontract.AnnotationTokenSHA256: hex.EncodeToString(sum[:])}},
		Spec: corev1.PodSpec{
			NodeSelector:                  map[string]string{podcontract.LabelPool: pool},
			Tolerations:                   []corev1.Toleration{{Key: podcontract.LabelPool, Operator: corev1.TolerationOpExists}},
			TerminationGracePeriodSeconds: new(int64),
			Containers: []corev1.Container{{Name: "task", Image: image, Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")}}}},
		},
	}
	if nodeName != "" {
		pod.Spec.NodeName, pod.Spec.NodeSelector = nodeName, nil
	}
	return pod
}

// readyWatch records when each pod of the namespace is first seen Ready,
// through an informer (a plain watch may be closed by the apiserver when a
// burst outruns its reader; the informer resumes it).
type readyWatch struct {
	mu        sync.Mutex
	ready     map[string]time.Time
	scheduled map[string]time.Time
	stop      context.CancelFunc
}

func (b *vkBench) watchReady(ctx context.Context) (*readyWatch, error) {
	ctx, cancel := context.WithCancel(ctx)
	rw := &readyWatch{ready: map[string]time.Time{}, scheduled: map[string]time.Time{}, stop: cancel}
	factory := informers.NewSharedInformerFactoryWithOptions(b.kube, 0, informers.WithNamespace(b.ns))
	inf := factory.Core().V1().Pods().Informer()
	see := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		now := time.Now()
		rw.mu.Lock()
		defer rw.mu.Unlock()
		if _, seen := rw.scheduled[pod.Name]; !seen && pod.Spec.NodeName != "" {
			rw.scheduled[pod.Name] = now
		}
		if _, seen := rw.ready[pod.Name]; !seen && podIsReady(pod) {
			rw.ready[pod.Name] = now
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: see, UpdateFunc: func(_, cur any) { see(cur) }}); err != nil {
		cancel()
		return nil, err
	}
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		cancel()
		return nil, fmt.Errorf("pod informer did not sync")
	}
	return rw, nil
}

func (rw *readyWatch) wait(names []string, timeout time.Duration) (map[string]time.Time, error) {
	return rw.waitFor(rw.ready, "Ready", names, timeout)
}

// waitScheduled waits until each pod has a node.
func (rw *readyWatch) waitScheduled(names []string, timeout time.Duration) (map[string]time.Time, error) {
	return rw.waitFor(rw.scheduled, "scheduled", names, timeout)
}

func (rw *readyWatch) waitFor(seen map[string]time.Time, what string, names []string, timeout time.Duration) (map[string]time.Time, error) {
	deadline := time.Now().Add(timeout)
	for {
		rw.mu.Lock()
		done := 0
		for _, n := range names {
			if _, ok := seen[n]; ok {
				done++
			}
		}
		out := map[string]time.Time{}
		if done == len(names) {
			for _, n := range names {
				out[n] = seen[n]
			}
		}
		rw.mu.Unlock()
		if done == len(names) {
			return out, nil
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("%d of %d pods %s after %v", done, len(names), what, timeout)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// singleResult is one slot kind's single-pod figures: the node API bind
// alone (the baseline), pod create → Ready through kube-scheduler, the same
// with spec.nodeName preset, and that path's stages (trace).
type singleResult struct {
	direct, full, preset durations
	trace                []traceStage
}

// single measures one pod at a time: the node API bind alone (baseline),
// then pod create → Ready through sandman-vk, scheduled and with
// spec.nodeName preset. Before each, the runtime has want slots in state
// (so a hot or warm slot is there, as in steady state). sandman-vk logs
// each pod's stages at debug level ("pod ready trace"); the preset pods'
// are lined up with the bench's own times for the breakdown.
func (b *vkBench) single(ctx context.Context, pool string, rt *noderuntime.Runtime, image string, n int, state runtime.SlotState, want int) (singleResult, error) {
	var res singleResult
	if err := waitCount(ctx, rt, state, want); err != nil {
		return res, err
	}
	i := 0
	var err error
	res.direct, err = sampleN(n, func() (time.Duration, error) {
		if err := waitCount(ctx, rt, state, want); err != nil {
			return 0, err
		}
		i++
		uid := fmt.Sprintf("direct-%s-%d", pool, i)
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		_, events, err := rt.Watch(wctx)
		if err != nil {
			return 0, err
		}
		start := time.Now()
		if _, err := rt.Bind(ctx, runtimetest.Request(uid, image)); err != nil {
			return 0, err
		}
		for ev := range events {
			if ev.Type == runtime.EventReady && ev.Slot.Pod != nil && ev.Slot.Pod.UID == uid {
				break
			}
		}
		elapsed := time.Since(start)
		return elapsed, rt.Release(ctx, uid, 0)
	})
	if err != nil {
		return res, err
	}
	agents, stopAgents, err := serveAgents(ctx, map[string]runtime.Runtime{"node-" + pool: rt})
	if err != nil {
		return res, err
	}
	defer stopAgents()
	vk, err := b.startVK(ctx, pool, agents, "--log-level", "debug")
	if err != nil {
		return res, err
	}
	defer vk.stop(b.kube)
	rw, err := b.watchReady(ctx)
	if err != nil {
		return res, err
	}
	defer rw.stop()
	var marks []podMarks
	sample := func(nodeName string) (durations, error) {
		return sampleN(n, func() (time.Duration, error) {
			if err := waitCount(ctx, rt, state, want); err != nil {
				return 0, err
			}
			i++
			name := fmt.Sprintf("single-%s-%d", pool, i)
			start := time.Now()
			pod, err := b.kube.CoreV1().Pods(b.ns).Create(ctx, b.pod(name, pool, image, nodeName), metav1.CreateOptions{})
			if err != nil {
				return 0, err
			}
			created := time.Now()
			at, err := rw.wait([]string{name}, time.Minute)
			if err != nil {
				return 0, fmt.Errorf("%w\n%s", err, vk.out.String())
			}
			if nodeName != "" {
				marks = append(marks, podMarks{uid: string(pod.UID), start: start, created: created, ready: at[name]})
			}
			elapsed := at[name].Sub(start)
			if err := b.kube.CoreV1().Pods(b.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil {
				return 0, err
			}
			return elapsed, b.waitGone(ctx, []string{name})
		})
	}
	if res.full, err = sample(""); err != nil {
		return res, err
	}
	if res.preset, err = sample(vk.node); err != nil {
		return res, err
	}
	res.trace, err = traceBreakdown(marks, vk.out.String())
	return res, err
}

// rows are the single-pod rows of one slot kind: the baseline, the path
// through kube-scheduler, the path with spec.nodeName preset (the target)
// and its stages.
func (r singleResult) rows(kind, target string) []row {
	out := []row{
		{name: "node API bind → daemon answers, " + kind + " (baseline)", n: len(r.direct), p50: ms(r.direct.p50()), p99: ms(r.direct.p99()), baseline: "-", ratio: "1.00×"},
		{name: "pod create → Ready, " + kind + ", through kube-scheduler", n: len(r.full), p50: ms(r.full.p50()), p99: ms(r.full.p99()), baseline: "node API bind", ratio: ratio(r.full.p50(), r.direct.p50())},
		{name: "pod create → Ready, " + kind + ", spec.nodeName preset (full path)", n: len(r.preset), p50: ms(r.preset.p50()), p99: ms(r.preset.p99()), baseline: "node API bind", ratio: ratio(r.preset.p50(), r.direct.p50()), note: target},
	}
	for _, st := range r.trace {
		out = append(out, row{name: "  stage " + st.name + " (" + kind + ", preset)", n: len(st.d), p50: ms(st.d.p50()), p99: ms(st.d.p99()), baseline: "full path", ratio: ratio(st.d.p50(), r.preset.p50()), note: st.what})
	}
	return out
}

// podMarks are the bench's own times for one pod: before the create call,
// after it answered, and when the pod was seen Ready.
type podMarks struct {
	uid                   string
	start, created, ready time.Time
}

// traceStage is one stage of pod create → Ready, over the traced pods.
type traceStage struct {
	name, what string
	d          durations
}

// traceBreakdown lines the bench's marks up with sandman-vk's "pod ready
// trace" log lines (JSON; durations in nanoseconds, absolute times in
// Unix nanoseconds; one machine, one clock).
func traceBreakdown(marks []podMarks, log string) ([]traceStage, error) {
	type line struct {
		Msg     string `json:"msg"`
		UID     string `json:"uid"`
		Created int64  `json:"created_unix_nano"`
		Status  int64  `json:"status_unix_nano"`
		Admit   int64  `json:"admit"`
		Bind    int64  `json:"bind"`
		Ready   int64  `json:"ready"`
		Notify  int64  `json:"notify"`
		StatusD int64  `json:"status"`
	}
	traces := map[string]line{}
	for l := range strings.SplitSeq(log, "\n") {
		if !strings.Contains(l, `"pod ready trace"`) {
			continue
		}
		var t line
		if json.Unmarshal([]byte(l), &t) == nil {
			traces[t.UID] = t
		}
	}
	stages := []traceStage{
		{name: "create", what: "the create call: client → apiserver → etcd → answer"},
		{name: "informer", what: "the apiserver's watch → virtual-kubelet's pod controller → CreatePod"},
		{name: "admit", what: "CreatePod → a node chosen (admission queue, placement)"},
		{name: "bind", what: "the node API bind call (HTTP, the agent's bind)"},
		{name: "ready", what: "bind answered → the node's ready event (the daemon takes its assignment)"},
		{name: "notify", what: "the node's ready event → the provider (the agent's watch stream, the pool)"},
		{name: "status", what: "the provider → the status handed to virtual-kubelet (status queue)"},
		{name: "write", what: "virtual-kubelet writes the status → the bench's informer sees Ready"},
	}
	for _, m := range marks {
		t, ok := traces[m.uid]
		if !ok {
			return nil, fmt.Errorf("sandman-vk logged no trace for pod %s", m.uid)
		}
		ds := []time.Duration{m.created.Sub(m.start), time.Unix(0, t.Created).Sub(m.created),
			time.Duration(t.Admit), time.Duration(t.Bind), time.Duration(t.Ready), time.Duration(t.Notify),
			time.Duration(t.StatusD), m.ready.Sub(time.Unix(0, t.Status))}
		for i, d := range ds {
			stages[i].d = append(stages[i].d, d)
		}
	}
	return stages, nil
}

func (b *vkBench) waitGone(ctx context.Context, names []string) error {
	return b.waitGoneFor(ctx, 2*time.Minute)
}

// waitGoneFor waits until the namespace has no pods.
func (b *vkBench) waitGoneFor(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		l, err := b.kube.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(l.Items) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%d pods not gone", len(l.Items))
		}
		time.Sleep(min(time.Second, time.Duration(len(l.Items))*time.Millisecond))
	}
}

// burstResult is one burst's figures.
type burstResult struct {
	n                 int
	create, ready     durations
	total             time.Duration
	vkCPU, apiCPU     time.Duration
	vkPeakRSS, apiRSS int64
	deleteAll         time.Duration
	allWarm           bool
	// Filled by the scale suite: all created (last create call returned),
	// etcd and scheduler, apiserver requests by resource.
	created             time.Duration
	etcdCPU, schedCPU   time.Duration
	kcmCPU, selfCPU     time.Duration
	etcdRSS, apiPeakRSS int64
	requests            map[string]float64
}

func (r burstResult) rows(name string) []row {
	rate := float64(r.n) / r.total.Seconds()
	warm := "every slot warm again"
	if !r.allWarm {
		warm = "NOT every slot warm again"
	}
	return []row{
		{name: name + ": pod create call (baseline)", n: r.n, p50: ms(r.create.p50()), p99: ms(r.create.p99()), baseline: "-", ratio: "1.00×"},
		{name: name + ": create → Ready", n: r.n, p50: ms(r.ready.p50()), p99: ms(r.ready.p99()), baseline: "create call", ratio: ratio(r.ready.p50(), r.create.p50()),
			note: fmt.Sprintf("%.0f pods/s to all Ready (%.2f s); sandman-vk %.1f CPU-s, peak RSS %d MB; apiserver %.1f CPU-s, RSS %d MB; delete all %.2f s, %s",
				rate, r.total.Seconds(), r.vkCPU.Seconds(), r.vkPeakRSS>>20, r.apiCPU.Seconds(), r.apiRSS>>20, r.deleteAll.Seconds(), warm)},
	}
}

// burst creates n pods at once and measures them to Ready, then deletes
// them all and checks every slot is free again.
func (b *vkBench) burst(ctx context.Context, pool string, agents map[string]runtime.Runtime, image string, n int, preset bool) (burstResult, error) {
	res := burstResult{n: n}
	list, stopAgents, err := serveAgents(ctx, agents)
	if err != nil {
		return res, err
	}
	defer stopAgents()
	poolName := pool
	if preset {
		poolName += "-preset"
	}
	vk, err := b.startVK(ctx, poolName, list)
	if err != nil {
		return res, err
	}
	defer vk.stop(b.kube)
	rw, err := b.watchReady(ctx)
	if err != nil {
		return res, err
	}
	defer rw.stop()
	apiPID := pidOf(b.env["SANDMAN_STATE"], "kube-apiserver")
	etcdPID, schedPID := pidOf(b.env["SANDMAN_STATE"], "etcd"), pidOf(b.env["SANDMAN_STATE"], "kube-scheduler")
	vkCPU0, apiCPU0 := cpuTime(vk.cmd.Process.Pid), cpuTime(apiPID)
	etcdCPU0, schedCPU0 := cpuTime(etcdPID), cpuTime(schedPID)
	kcmPID := pidOf(b.env["SANDMAN_STATE"], "kube-controller-manager")
	kcmCPU0, selfCPU0 := cpuTime(kcmPID), cpuTime(os.Getpid())
	req0 := vkRequests(vk.metrics)

	names := make([]string, n)
	starts := make([]time.Time, n)
	res.create = make(durations, n)
	profiling := n >= 5000
	var cpuProfile sync.WaitGroup
	if profiling {
		// sandman-vk's CPU over the first 30 s of a big burst.
		cpuProfile.Go(func() { saveProfile(vk.metrics, "profile?seconds=30", poolName+"-cpu") })
	}
	var g errgroup.Group
	g.SetLimit(64)
	begin := time.Now()
	for i := range n {
		names[i] = fmt.Sprintf("%s-%04d", poolName, i)
		g.Go(func() error {
			node := ""
			if preset {
				node = vk.node
			}
			starts[i] = time.Now()
			_, err := b.kube.CoreV1().Pods(b.ns).Create(ctx, b.pod(names[i], poolName, image, node), metav1.CreateOptions{})
			res.create[i] = time.Since(starts[i])
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return res, err
	}
	res.created = time.Since(begin)
	at, err := rw.wait(names, max(5*time.Minute, time.Duration(n)*50*time.Millisecond))
	if err != nil {
		return res, fmt.Errorf("%w (%s)\n%s", err, b.podSummary(ctx), tail(vk.out.String(), 2000))
	}
	res.ready, res.total = readyTimes(names, starts, at, begin)
	if profiling {
		saveProfile(vk.metrics, "heap", poolName+"-heap")
		cpuProfile.Wait()
	}
	res.vkCPU, res.apiCPU = cpuTime(vk.cmd.Process.Pid)-vkCPU0, cpuTime(apiPID)-apiCPU0
	res.vkPeakRSS, res.apiRSS = statusKB(vk.cmd.Process.Pid, "VmHWM")<<10, statusKB(apiPID, "VmRSS")<<10
	res.etcdCPU, res.schedCPU = cpuTime(etcdPID)-etcdCPU0, cpuTime(schedPID)-schedCPU0
	res.kcmCPU, res.selfCPU = cpuTime(kcmPID)-kcmCPU0, cpuTime(os.Getpid())-selfCPU0
	res.etcdRSS, res.apiPeakRSS = statusKB(etcdPID, "VmRSS")<<10, statusKB(apiPID, "VmHWM")<<10
	res.requests = map[string]float64{}
	for k, v := range vkRequests(vk.metrics) {
		res.requests[k] = v - req0[k]
	}

	// Each pod deleted on its own, as trainers release sandboxes (the
	// apiserver's DeleteCollection deletes one pod at a time).
	start := time.Now()
	var dg errgroup.Group
	dg.SetLimit(64)
	for _, name := range names {
		dg.Go(func() error {
			err := b.kube.CoreV1().Pods(b.ns).Delete(ctx, name, metav1.DeleteOptions{})
			if apierrors.IsNotFound(err) {
				return nil
			}
			return err
		})
	}
	if err := dg.Wait(); err != nil {
		return res, err
	}
	if err := b.waitGoneFor(ctx, max(2*time.Minute, time.Duration(n)*20*time.Millisecond)); err != nil {
		return res, err
	}
	res.deleteAll = time.Since(start)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		free, total := 0, 0
		for _, rt := range agents {
			inv, err := rt.Inventory(ctx)
			if err != nil {
				return res, err
			}
			c := inv.Count()
			free += c[runtime.StateWarm] + c[runtime.StateHot]
			total += inv.Capacity.Slots
			// The real runtime keeps only --warm-slots warm; the rest are
			// free capacity, not bound.
			free += inv.Capacity.Slots - len(inv.Slots)
		}
		if free == total {
			res.allWarm = true
			break
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	return res, nil
}

// readyTimes: each pod's create → Ready, and the burst's start to its last
// Ready.
func readyTimes(names []string, starts []time.Time, at map[string]time.Time, begin time.Time) (durations, time.Duration) {
	var ready durations
	last := begin
	for i, name := range names {
		ready = append(ready, at[name].Sub(starts[i]))
		if at[name].After(last) {
			last = at[name]
		}
	}
	return ready, last.Sub(begin)
}

// saveProfile fetches a pprof profile from sandman-vk into the temp dir.
func saveProfile(addr, what, name string) {
	resp, err := http.Get("http://" + addr + "/debug/pprof/" + what)
	if err != nil {
		fmt.Fprintf(os.Stderr, "profile %s: %v\n", name, err)
		return
	}
	defer resp.Body.Close()
	path := filepath.Join(os.TempDir(), "sandman-bench-"+name+".pprof")
	f, err := os.Create(path)
	if err != nil {
		return
	}
	defer f.Close()
	if _, err := io.Copy(f, resp.Body); err == nil {
		fmt.Fprintf(os.Stderr, "profile: %s (go tool pprof -top %s)\n", path, path)
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

func pidOf(state, name string) int {
	b, err := os.ReadFile(filepath.Join(state, "pids", name+".pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// cpuTime is a process's user+system CPU time so far.
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(fields) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(fields[11], 10, 64)
	st, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// machineCPU is the machine's busy and total CPU time so far (/proc/stat's
// first line: busy is everything but idle and iowait).
func machineCPU() (busy, total time.Duration) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	fields := strings.Fields(line)
	if len(fields) < 6 || fields[0] != "cpu" {
		return 0, 0
	}
	var all, idle int64
	for i, f := range fields[1:] {
		v, _ := strconv.ParseInt(f, 10, 64)
		all += v
		if i == 3 || i == 4 { // idle, iowait
			idle += v
		}
	}
	tick := time.Second / 100 // USER_HZ
	return time.Duration(all-idle) * tick, time.Duration(all) * tick
}

// statusKB reads a kB field of /proc/pid/status.
func statusKB(pid int, field string) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return 0
}

// podSummary counts the namespace's pods by phase and shows one pending.
func (b *vkBench) podSummary(ctx context.Context) string {
	l, err := b.kube.CoreV1().Pods(b.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err.Error()
	}
	phases := map[corev1.PodPhase]int{}
	example := ""
	for _, p := range l.Items {
		phases[p.Status.Phase]++
		if !podIsReady(&p) && example == "" {
			example = fmt.Sprintf("%s on %q: %+v %+v", p.Name, p.Spec.NodeName, p.Status.Conditions, p.Status.ContainerStatuses)
		}
	}
	return fmt.Sprintf("%v; %s", phases, example)
}

func podIsReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// freeAddr is host with a port free now.
func freeAddr(host string) string {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return net.JoinHostPort(host, "0")
	}
	defer l.Close()
	return l.Addr().String()
}

// execLatency runs the same command in one sandbox through its daemon
// directly (baseline) and through kubectl exec (apiserver → the virtual
// node's kubelet API → the daemon).
func (b *vkBench) execLatency(ctx context.Context, image string, n int) ([]row, error) {
	rt, stop, err := b.be.startRuntime(ctx, "bench-vk-exec", func(c *noderuntime.Config) { c.Slots, c.WarmSlots = 2, 1 })
	if err != nil {
		return nil, err
	}
	defer stop()
	agents, stopAgents, err := serveAgents(ctx, map[string]runtime.Runtime{"node-exec": rt})
	if err != nil {
		return nil, err
	}
	defer stopAgents()
	pki := b.env["PKI"]
	vk, err := b.startVK(ctx, "exec", agents, "--tls-cert-file", filepath.Join(pki, "kubelet-serving.crt"),
		"--tls-key-file", filepath.Join(pki, "kubelet-serving.key"), "--client-ca-file", filepath.Join(pki, "ca.crt"))
	if err != nil {
		return nil, err
	}
	defer vk.stop(b.kube)
	rw, err := b.watchReady(ctx)
	if err != nil {
		return nil, err
	}
	defer rw.stop()
	if _, err := b.kube.CoreV1().Pods(b.ns).Create(ctx, b.pod("exec-target", "exec", image, ""), metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if _, err := rw.wait([]string{"exec-target"}, 2*time.Minute); err != nil {
		return nil, err
	}
	defer func() {
		_ = b.kube.CoreV1().Pods(b.ns).Delete(context.Background(), "exec-target", metav1.DeleteOptions{})
		_ = b.waitGone(context.Background(), nil)
	}()
	pod, err := b.kube.CoreV1().Pods(b.ns).Get(ctx, "exec-target", metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	c, err := client.New(pod.Status.PodIP+":49983", client.WithToken("bench"))
	if err != nil {
		return nil, err
	}
	direct, err := timeN(n, func() error {
		res, err := c.Exec(ctx, daemonapi.ExecRequest{Cmd: []string{"true"}})
		if err == nil && res.ExitCode != 0 {
			err = fmt.Errorf("exit %d", res.ExitCode)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("direct exec: %w", err)
	}
	kubectl, err := timeN(n, func() error {
		cmd := exec.CommandContext(ctx, b.env["KUBECTL"], "-n", b.ns, "exec", "exec-target", "--", "true")
		cmd.Env = append(os.Environ(), "KUBECONFIG="+b.env["KUBECONFIG"])
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("kubectl exec: %w", err)
	}
	version, err := timeN(n, func() error {
		cmd := exec.CommandContext(ctx, b.env["KUBECTL"], "version", "--client")
		return cmd.Run()
	})
	if err != nil {
		return nil, err
	}
	return []row{
		{name: "exec `true` through the daemon directly (baseline)", n: n, p50: ms(direct.p50()), p99: ms(direct.p99()), baseline: "-", ratio: "1.00×"},
		{name: "kubectl exec `true` (apiserver → virtual node → daemon)", n: n, p50: ms(kubectl.p50()), p99: ms(kubectl.p99()), baseline: "direct exec", ratio: ratio(kubectl.p50(), direct.p50()),
			note: fmt.Sprintf("of which kubectl's own start (kubectl version --client): %s p50", ms(version.p50()))},
	}, nil
}

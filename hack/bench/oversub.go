package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/fake"
)

// The oversubscribed burst (BENCH_SUITE=scale, part "oversub"): job A
// creates oversubA pods at once, job B oversubB pods oversubBDelay later,
// onto oversubSlots slots; each sandbox works oversubWork after it is Ready
// and is then deleted by the trainer (this bench), so slots turn over.
var (
	oversubSlots  = envInt("BENCH_OVERSUB_SLOTS", 1000)
	oversubA      = envInt("BENCH_OVERSUB_A", 5000)
	oversubB      = envInt("BENCH_OVERSUB_B", 200)
	oversubBDelay = time.Duration(envInt("BENCH_OVERSUB_B_DELAY_S", 60)) * time.Second
	oversubWork   = time.Duration(envInt("BENCH_OVERSUB_WORK_S", 20)) * time.Second
	// oversubPerNode is the pods capacity of each ordinary node.
	oversubPerNode = 5
)

// oversubMode is one way of scheduling the same burst.
type oversubMode struct {
	// key names the mode in BENCH_OVERSUB_MODES (comma-separated; empty:
	// all): truthful, room, preset, nodes200, nodes1000.
	key, name string
	// queueRoom: sandman-vk's --queue-room (virtual node modes).
	queueRoom string
	// preset: the trainer names the virtual node (spec.nodeName), so
	// kube-scheduler never schedules the pods.
	preset bool
	// nodes: ordinary Node objects of oversubPerNode pods each (0: the
	// virtual node).
	nodes int
}

// oversubResult is one mode's run.
type oversubResult struct {
	mode            oversubMode
	readyA, readyB  durations
	makespan, ideal time.Duration
	// bound: the least makespan whole sandboxes allow: some slot runs
	// ceil(pods / slots) of them, one after another.
	bound               time.Duration
	schedCPU, apiCPU    time.Duration
	attempts            map[string]float64
	apiRequests         float64
	requestMix          map[string]float64
	terminatedWatches   float64 // watches the apiserver closed for falling behind
	failed, slots, pods int
	// pending is kube-scheduler's pending pods (all queues) over time.
	pending []point
	// idle: slot-seconds without a Ready pod, sampled every second until
	// the last pod is Ready, by where the pods were meanwhile: waiting in
	// kube-scheduler (no node yet; a create in flight counts here), on
	// the node (bound to it, not Ready: the pool's queue, the bind), or
	// none waiting (job B not created yet, pods being deleted).
	idleSched, idleNode, idleNone float64
	// busy is the share of the machine's CPU time in use over the run.
	busy float64
	// turnover says where a slot's turnover went (virtual node modes).
	turnover string
}

// point is one sample of a time series.
type point struct {
	at time.Duration
	v  float64
}

func (b *vkBench) oversubscribed(ctx context.Context, image string) ([]row, map[string]durations, map[string][]point, error) {
	modes := []oversubMode{
		{key: "truthful", name: "virtual node, truthful capacity (pods = slots)", queueRoom: "0"},
		{key: "room", name: "virtual node, queue room advertised", queueRoom: "-1"},
		{key: "preset", name: "virtual node, queue room, spec.nodeName preset by the trainer", queueRoom: "-1", preset: true},
		{key: "nodes200", name: fmt.Sprintf("%d ordinary nodes × %d pods", oversubSlots/oversubPerNode, oversubPerNode), nodes: oversubSlots / oversubPerNode},
		{key: "nodes1000", name: fmt.Sprintf("%d ordinary nodes × %d pods", 1000, oversubPerNode), nodes: 1000},
	}
	var rows []row
	cdf, pending := map[string]durations{}, map[string][]point{}
	for _, m := range modes {
		if only := os.Getenv("BENCH_OVERSUB_MODES"); only != "" && !slices.Contains(strings.Split(only, ","), m.key) {
			continue
		}
		fmt.Fprintf(os.Stderr, "scale: oversubscribed burst, %s\n", m.name)
		r, err := b.oversubRun(ctx, image, m)
		if err != nil {
			return rows, cdf, pending, fmt.Errorf("oversubscribed burst, %s: %w", m.name, err)
		}
		rows = append(rows, r.row())
		fmt.Fprint(os.Stderr, render(rows[len(rows)-1:]))
		cdf[m.name+": job A"] = r.readyA
		cdf[m.name+": job B"] = r.readyB
		pending[m.name] = r.pending
	}
	return rows, cdf, pending, nil
}

func (r oversubResult) row() row {
	n := len(r.readyA) + len(r.readyB)
	attempts := 0.0
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(r.attempts)) {
		attempts += r.attempts[k]
		parts = append(parts, fmt.Sprintf("%s %.2f", k, r.attempts[k]/float64(n)))
	}
	return row{
		name: "oversubscribed burst, " + r.mode.name + ": job A create → Ready",
		n:    n, p50: ms(r.readyA.p50()), p99: ms(r.readyA.p99()),
		baseline: fmt.Sprintf("ideal makespan %.0f s", r.ideal.Seconds()), ratio: fmt.Sprintf("%.2f× makespan", r.makespan.Seconds()/r.ideal.Seconds()),
		note: fmt.Sprintf("job B (%d pods, %s later) create → Ready p50 %s, p99 %s; makespan %.0f s (%.2f× the %.0f s whole sandboxes allow); "+
			"idle slot-seconds before the last Ready: %.0f with pods in kube-scheduler, %.0f with pods bound and not Ready, %.0f with no pod waiting; "+
			"machine CPU %.0f %% busy; kube-scheduler %.3f ms CPU/pod, %.2f attempts/pod (%s); "+
			"apiserver %.2f ms CPU/pod, %.1f requests/pod (%s), %.0f watches closed for falling behind; %d pods Failed; %d slots, pods capacity %d",
			len(r.readyB), oversubBDelay, ms(r.readyB.p50()), ms(r.readyB.p99()), r.makespan.Seconds(), r.makespan.Seconds()/r.bound.Seconds(), r.bound.Seconds(),
			r.idleSched, r.idleNode, r.idleNone, 100*r.busy,
			r.schedCPU.Seconds()*1000/float64(n), attempts/float64(n), strings.Join(parts, ", "),
			r.apiCPU.Seconds()*1000/float64(n), r.apiRequests/float64(n), perPod(r.requestMix, n), r.terminatedWatches, r.failed, r.slots, r.pods) + turnoverNote(r.turnover),
	}
}

// oversubRun runs the burst in one mode and releases everything after.
func (b *vkBench) oversubRun(ctx context.Context, image string, m oversubMode) (oversubResult, error) {
	res := oversubResult{mode: m, attempts: map[string]float64{}}
	var podFor func(name, job string) *corev1.Pod
	var tr *turnover
	vkMetrics := ""
	if m.nodes == 0 {
		tr = newTurnover()
		tctx, stopTrace := context.WithCancel(ctx)
		defer stopTrace()
		agents := map[string]runtime.Runtime{}
		perAgent := 100
		for i := range max(1, oversubSlots/perAgent) {
			name := fmt.Sprintf("oversub-%02d", i)
			f, err := fake.New(fake.Config{Node: name, Slots: perAgent, IPBase: fmt.Sprintf("10.%d.%d", 200+i/250, i%250),
				BindLatency: 20 * time.Millisecond, ReadyLatency: 5 * time.Millisecond, Resources: runtime.Resources{MilliCPU: 1 << 40, MemoryBytes: 1 << 50}})
			if err != nil {
				return res, err
			}
			defer f.Close()
			agents[name] = f
			if err := tr.watch(tctx, name, f); err != nil {
				return res, err
			}
		}
		list, stopAgents, err := serveAgents(ctx, agents)
		if err != nil {
			return res, err
		}
		defer stopAgents()
		pool := "oversub-" + rand.String(4)
		vk, err := b.startVK(ctx, pool, list, append([]string{"--queue-room", m.queueRoom}, strings.Fields(os.Getenv("BENCH_OVERSUB_VK_ARGS"))...)...)
		if err != nil {
			return res, err
		}
		defer vk.stop(b.kube)
		vkMetrics = vk.metrics
		n, err := b.kube.CoreV1().Nodes().Get(ctx, vk.node, metav1.GetOptions{})
		if err != nil {
			return res, err
		}
		res.slots, res.pods = len(agents)*perAgent, int(n.Status.Capacity.Pods().Value())
		nodeName := ""
		if m.preset {
			nodeName = vk.node
		}
		podFor = func(name, job string) *corev1.Pod {
			p := b.pod(name, pool, image, nodeName)
			p.Labels = map[string]string{podcontract.LabelJob: job}
			return p
		}
	} else {
		label := "sandman-bench-oversub-" + rand.String(4)
		_, stopNodes, err := b.fakeKubelets(ctx, label, m.nodes, oversubPerNode)
		if err != nil {
			return res, err
		}
		defer stopNodes()
		res.slots, res.pods = m.nodes*oversubPerNode, m.nodes*oversubPerNode
		podFor = func(name, job string) *corev1.Pod {
			return &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: b.ns, Labels: map[string]string{podcontract.LabelJob: job}},
				Spec: corev1.PodSpec{
					NodeSelector:                  map[string]string{label: "true"},
					TerminationGracePeriodSeconds: ptr.To[int64](0),
					Containers: []corev1.Container{{Name: "task", Image: image, Resources: corev1.ResourceRequirements{
						Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")}}}},
				},
			}
		}
	}

	// The trainer: each pod is deleted oversubWork after it is first
	// seen Ready; a Failed pod is counted and deleted.
	var mu sync.Mutex
	created, ready := map[string]time.Time{}, map[string]time.Time{}
	failed := map[string]bool{}
	gone := map[string]bool{}
	scheduled := map[string]bool{}
	wctx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	del := func(name string) {
		start := time.Now()
		err := b.kube.CoreV1().Pods(b.ns).Delete(wctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
		if tr != nil {
			tr.deleting(name, start, time.Now())
		}
		if err != nil && !apierrors.IsNotFound(err) && wctx.Err() == nil {
			fmt.Fprintf(os.Stderr, "oversub: delete %s: %v\n", name, err)
		}
	}
	factory := informers.NewSharedInformerFactoryWithOptions(b.kube, 0, informers.WithNamespace(b.ns))
	inf := factory.Core().V1().Pods().Informer()
	see := func(obj any) {
		pod, ok := obj.(*corev1.Pod)
		if !ok {
			return
		}
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if pod.Spec.NodeName != "" {
			scheduled[pod.Name] = true
		}
		if _, seen := ready[pod.Name]; !seen && podIsReady(pod) {
			ready[pod.Name] = now
			name := pod.Name
			time.AfterFunc(oversubWork, func() { del(name) })
		}
		if pod.Status.Phase == corev1.PodFailed && !failed[pod.Name] {
			failed[pod.Name] = true
			go del(pod.Name)
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: see, UpdateFunc: func(_, cur any) { see(cur) },
		DeleteFunc: func(obj any) {
			if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = t.Obj
			}
			if pod, ok := obj.(*corev1.Pod); ok {
				mu.Lock()
				gone[pod.Name] = true
				mu.Unlock()
				if tr != nil {
					tr.gone(pod.Name, time.Now())
				}
			}
		}}); err != nil {
		return res, err
	}
	factory.Start(wctx.Done())
	if !cache.WaitForCacheSync(wctx.Done(), inf.HasSynced) {
		return res, fmt.Errorf("pod informer did not sync")
	}

	schedPID, apiPID := pidOf(b.env["SANDMAN_STATE"], "kube-scheduler"), pidOf(b.env["SANDMAN_STATE"], "kube-apiserver")
	sched0, api0 := cpuTime(schedPID), cpuTime(apiPID)
	busy0, total0 := machineCPU()
	attempts0 := b.schedulerMetric(ctx, "scheduler_schedule_attempts_total")
	requests0 := b.apiserverMetric(ctx, "apiserver_request_total")
	terminated0 := sumValues(b.apiserverMetric(ctx, "apiserver_terminated_watchers_total"))
	begin := time.Now()

	// Where idle slots were, every second; kube-scheduler's pending pods
	// every 5 s: its /metrics is ~350 KB of text, and encoding it every
	// second was 6 % of kube-scheduler's CPU in this bench (its CPU
	// profile), counted in the CPU per pod reported.
	var sampler sync.WaitGroup
	sampler.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for tick := 0; ; tick++ {
			if tick%5 == 0 {
				v := sumValues(b.schedulerMetric(wctx, "scheduler_pending_pods"))
				mu.Lock()
				res.pending = append(res.pending, point{at: time.Since(begin), v: v})
				mu.Unlock()
			}
			mu.Lock()
			// Where the slots without a Ready pod were, while pods waited.
			busy, inSched, onNode := 0, 0, 0
			for name := range created {
				_, isReady := ready[name]
				switch {
				case gone[name]:
				case isReady:
					busy++
				case scheduled[name]:
					onNode++
				default:
					inSched++
				}
			}
			if idle := res.slots - busy; idle > 0 && len(ready) < oversubA+oversubB {
				s := min(idle, inSched)
				n := min(idle-s, onNode)
				res.idleSched += float64(s)
				res.idleNode += float64(n)
				res.idleNone += float64(idle - s - n)
			}
			mu.Unlock()
			select {
			case <-wctx.Done():
				return
			case <-t.C:
			}
		}
	})

	create := func(job string, n int) ([]string, error) {
		names := make([]string, n)
		var g errgroup.Group
		g.SetLimit(64)
		for i := range n {
			names[i] = fmt.Sprintf("%s-%05d", strings.ToLower(job), i)
			g.Go(func() error {
				mu.Lock()
				created[names[i]] = time.Now()
				mu.Unlock()
				_, err := b.kube.CoreV1().Pods(b.ns).Create(ctx, podFor(names[i], job), metav1.CreateOptions{})
				return err
			})
		}
		return names, g.Wait()
	}
	namesA, err := create("A", oversubA)
	if err != nil {
		return res, err
	}
	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(time.Until(begin.Add(oversubBDelay))):
	}
	namesB, err := create("B", oversubB)
	if err != nil {
		return res, err
	}
	all := append(slices.Clone(namesA), namesB...)
	// The ideal: every slot busy from the first create, and no earlier
	// than job B's last pod can end.
	res.ideal = max(time.Duration(float64(len(all))*float64(oversubWork)/float64(res.slots)), oversubBDelay+oversubWork)
	res.bound = max(time.Duration((len(all)+res.slots-1)/res.slots)*oversubWork, oversubBDelay+oversubWork)
	deadline := time.Now().Add(max(10*time.Minute, 4*res.ideal))
	for {
		mu.Lock()
		left := 0
		for _, n := range all {
			if !gone[n] {
				left++
			}
		}
		mu.Unlock()
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			return res, fmt.Errorf("%d of %d pods not done after %v (%s)", left, len(all), time.Since(begin).Round(time.Second), b.podSummary(ctx))
		}
		time.Sleep(100 * time.Millisecond)
	}
	stopWatch()
	sampler.Wait()
	mu.Lock()
	defer mu.Unlock()
	var last time.Time
	for _, n := range all {
		if at, ok := ready[n]; ok && at.After(last) {
			last = at
		}
	}
	res.makespan = last.Add(oversubWork).Sub(begin)
	for _, n := range namesA {
		if at, ok := ready[n]; ok {
			res.readyA = append(res.readyA, at.Sub(created[n]))
		}
	}
	for _, n := range namesB {
		if at, ok := ready[n]; ok {
			res.readyB = append(res.readyB, at.Sub(created[n]))
		}
	}
	res.failed = len(failed)
	if tr != nil {
		res.turnover = tr.summary(ready) + stageMeans(ctx, vkMetrics)
	}
	res.schedCPU, res.apiCPU = cpuTime(schedPID)-sched0, cpuTime(apiPID)-api0
	if busy1, total1 := machineCPU(); total1 > total0 {
		res.busy = float64(busy1-busy0) / float64(total1-total0)
	}
	for k, v := range b.schedulerMetric(ctx, "scheduler_schedule_attempts_total") {
		res.attempts[labelValue(k, "result")] += v - attempts0[k]
	}
	requests1 := b.apiserverMetric(ctx, "apiserver_request_total")
	res.apiRequests = sumValues(requests1) - sumValues(requests0)
	res.requestMix = requestMix(requests0, requests1)
	res.terminatedWatches = sumValues(b.apiserverMetric(ctx, "apiserver_terminated_watchers_total")) - terminated0
	return res, nil
}

// schedulerMetric reads one metric family from kube-scheduler's /metrics
// (its secure port, with the admin client certificate), by label set. One
// client for the whole run, kept alive and uncompressed: kube-scheduler's
// CPU is what the bench measures, and a handshake and a gzip per scrape
// added to it.
func (b *vkBench) schedulerMetric(ctx context.Context, name string) map[string]float64 {
	port := os.Getenv("SCHEDULER_PORT")
	if port == "" {
		port = "20259"
	}
	b.schedOnce.Do(func() {
		cfg, err := clientcmd.BuildConfigFromFlags("", b.env["KUBECONFIG"])
		if err != nil {
			return
		}
		tlsCfg, err := rest.TLSConfigFor(cfg)
		if err != nil || tlsCfg == nil {
			return
		}
		tlsCfg.InsecureSkipVerify, tlsCfg.RootCAs = true, nil //nolint:gosec // the stack's own scheduler on loopback
		b.sched = &http.Client{Transport: &http.Transport{TLSClientConfig: tlsCfg, DisableCompression: true}, Timeout: 10 * time.Second}
	})
	if b.sched == nil {
		return nil
	}
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "https://127.0.0.1:"+port+"/metrics", nil)
	resp, err := b.sched.Do(req)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil
	}
	return parseFamily(body, name)
}

// apiserverMetric reads one metric family from the apiserver's /metrics.
func (b *vkBench) apiserverMetric(ctx context.Context, name string) map[string]float64 {
	body, err := b.kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil
	}
	return parseFamily(body, name)
}

// parseFamily returns the samples of one metric (its label set → value) of
// a Prometheus text exposition.
func parseFamily(body []byte, name string) map[string]float64 {
	out := map[string]float64{}
	sc := bufio.NewScanner(bytes.NewReader(body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		labels, value := "", strings.TrimSpace(rest)
		if strings.HasPrefix(rest, "{") {
			var ok bool
			labels, value, ok = strings.Cut(rest[1:], "} ")
			if !ok {
				continue
			}
		}
		if f, err := strconv.ParseFloat(strings.Fields(value)[0], 64); err == nil {
			out[labels] += f
		}
	}
	return out
}

func labelValue(labels, key string) string {
	for kv := range strings.SplitSeq(labels, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// requestMix counts the apiserver's requests between two readings of
// apiserver_request_total by verb, resource and subresource.
func requestMix(before, after map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		name := labelValue(k, "verb") + " " + labelValue(k, "resource")
		if sub := labelValue(k, "subresource"); sub != "" {
			name += "/" + sub
		}
		out[name] += v - before[k]
	}
	return out
}

// perPod names the requests of a mix per pod, the most frequent first
// (those under 0.05 per pod left out).
func perPod(mix map[string]float64, pods int) string {
	names := slices.Collect(maps.Keys(mix))
	slices.SortFunc(names, func(a, b string) int { return cmp.Compare(mix[b], mix[a]) })
	var parts []string
	for _, name := range names {
		if v := mix[name] / float64(pods); v >= 0.05 {
			parts = append(parts, fmt.Sprintf("%s %.2f", name, v))
		}
	}
	return strings.Join(parts, ", ")
}

func sumValues(m map[string]float64) float64 {
	t := 0.0
	for _, v := range m {
		t += v
	}
	return t
}

func turnoverNote(s string) string {
	if s == "" {
		return ""
	}
	return "; " + s
}

// stageMeans is sandman-vk's mean time per stage of a pod's way to Ready
// (sandman_vk_pod_stage_seconds), from its /metrics at addr.
func stageMeans(ctx context.Context, addr string) string {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return ""
	}
	sums, counts := parseFamily(body, "sandman_vk_pod_stage_seconds_sum"), parseFamily(body, "sandman_vk_pod_stage_seconds_count")
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(sums)) {
		if c := counts[k]; c > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f ms", labelValue(k, "stage"), 1000*sums[k]/c))
		}
	}
	if rs, rc := sumValues(parseFamily(body, "sandman_vk_release_seconds_sum")), sumValues(parseFamily(body, "sandman_vk_release_seconds_count")); rc > 0 {
		parts = append(parts, fmt.Sprintf("DeletePod → released %.0f ms", 1000*rs/rc))
	}
	if len(parts) == 0 {
		return ""
	}
	out := "; sandman-vk's stages, mean: " + strings.Join(parts, ", ")
	// Its own requests, by verb, resource and answer.
	reqs := map[string]float64{}
	for k, v := range parseFamily(body, "sandman_vk_apiserver_requests_total") {
		reqs[labelValue(k, "verb")+" "+labelValue(k, "resource")+" "+labelValue(k, "code")] += v
	}
	var mix []string
	for _, k := range slices.Sorted(maps.Keys(reqs)) {
		mix = append(mix, fmt.Sprintf("%s %.0f", k, reqs[k]))
	}
	return out + "; sandman-vk's requests: " + strings.Join(mix, ", ")
}

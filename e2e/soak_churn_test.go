//go:build soak && e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/e2e/soakreport"
)

// How a sandbox is meant to end.
const (
	modeDelete   = "delete"   // the trainer deletes it
	modeOwner    = "owner"    // its owner pod is deleted: Kubernetes' garbage collector
	modeIdle     = "idle"     // the idle lease (sandman.io/idle-timeout)
	modeDeadline = "deadline" // spec.activeDeadlineSeconds
)

const (
	// soakRole labels the soak's pods: sandbox, owner or warmup.
	soakRole = "soak.sandman.io/role"
	// idleTimeout is the idle lease of idle-mode sandboxes.
	idleTimeout = 15 * time.Second
	// readyTimeout is how long a sandbox may take to be Ready (faults and
	// bursts larger than the pool queue pods).
	readyTimeout = 10 * time.Minute
	// callTimeout bounds one daemon call.
	callTimeout = 30 * time.Second
	// windowSlack extends fault windows by the time the churn needs to see
	// a pod's new state (its pod list runs every second) before it stops
	// using the sandbox.
	windowSlack = 3 * time.Second
)

// churnRun is one run of TestSoakChurn.
type churnRun struct {
	t         *testing.T
	s         *framework.Stack
	cfg       soakConfig
	p         *vpool
	artifacts string
	nodeBin   string
	capacity  int
	hc        *http.Client
	watch     *podWatch

	// comps are the stack's processes the faults kill.
	comps map[string]*framework.Component
	// orig are the processes startPool started (its cleanups stop them).
	orig   map[string]*agent
	origVK *agent
	// stopped is the agent under SIGSTOP, if any; faulting is set while a
	// fault is injected (the sampler does not report its kills as crashes).
	stopped  *vagent
	faulting atomic.Bool

	createCtx, workCtx, sampleCtx          context.Context
	cancelCreate, cancelWork, cancelSample context.CancelFunc
	sampled                                chan struct{}
	start, stop                            time.Time

	censusBefore soakreport.Census
	warmBefore   map[string]int
	finished     bool

	seq   atomic.Int64
	live  atomic.Int64
	wg    sync.WaitGroup
	burst chan struct{}

	procMu sync.Mutex
	procs  map[string]soakProc // guarded by procMu: the current process of each component

	mu               sync.Mutex // guards the fields below
	calls            []soakreport.Call
	windows          []soakreport.Window
	skipped          []string
	sandboxes        []*sandboxRecord
	creates          int
	createErrs       int
	createErrSamples []string
	bursts, burstN   int
	samples          []soakreport.Sample
	doubles          map[string]*seenSpan
	problems         []string
	crashed          map[int]bool
	groups           []*ownerGroup
	group            *ownerGroup // the group new owner-mode sandboxes join
}

// soakProc is a component's current process.
type soakProc struct {
	pid, gen int
}

// seenSpan is when a double binding was seen first and last.
type seenSpan struct {
	first, last time.Time
	n           int
}

// sandboxRecord is one sandbox's history.
type sandboxRecord struct {
	Name    string    `json:"name"`
	Mode    string    `json:"mode"`
	Owner   string    `json:"owner,omitempty"`
	Burst   bool      `json:"burst,omitempty"`
	Spawned time.Time `json:"spawned"`
	Created time.Time `json:"created,omitzero"`
	Ready   time.Time `json:"ready,omitzero"`
	Ended   time.Time `json:"ended"`
	IP      string    `json:"ip,omitempty"`
	Rounds  int       `json:"rounds"`
	// Result is how it ended, short (the table's row); Detail the message.
	Result    string   `json:"result"`
	Detail    string   `json:"detail,omitempty"`
	AsPlanned bool     `json:"as_planned"`
	History   []string `json:"history,omitempty"`
}

func (rec *sandboxRecord) note(format string, a ...any) {
	rec.History = append(rec.History, time.Now().Format("15:04:05.000")+" "+fmt.Sprintf(format, a...))
}

// sandboxPlan is what a sandbox does, drawn from the seed and its number.
type sandboxPlan struct {
	mode     string
	rounds   int
	sizes    []int
	pauses   []time.Duration
	deadline int64 // seconds, deadline mode
	token    string
	dataSeed [32]byte
}

// ownerGroup is a trainer pod owning a few sandboxes; it is deleted once
// they have done their work.
type ownerGroup struct {
	name                string
	uid                 types.UID
	size, members, done int
	closed, deleting    bool
}

func newChurnRun(t *testing.T, s *framework.Stack, cfg soakConfig) *churnRun {
	return &churnRun{
		t: t, s: s, cfg: cfg, artifacts: soakArtifacts(t, "churn"),
		hc: &http.Client{Transport: &http.Transport{
			MaxIdleConnsPerHost: 2, IdleConnTimeout: 30 * time.Second,
			DialContext: (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		}},
		watch:   &podWatch{},
		burst:   make(chan struct{}, 1),
		sampled: make(chan struct{}),
		doubles: map[string]*seenSpan{},
		crashed: map[int]bool{},
		procs:   map[string]soakProc{},
	}
}

func (r *churnRun) agentsForCensus() []censusAgent {
	var out []censusAgent
	for _, a := range r.p.agents {
		out = append(out, censusAgentOf(a))
	}
	return out
}

// setup warms the pool up (every slot made and the image on every agent)
// and takes the census the end must equal.
func (r *churnRun) setup() {
	t, s, p := r.t, r.s, r.p
	r.nodeBin = buildNode(t, s.Root)
	r.capacity = r.cfg.Agents * r.cfg.Slots
	r.origVK = p.vk
	r.orig = map[string]*agent{}
	for _, a := range p.agents {
		r.orig[a.name] = a.proc
	}
	r.comps = map[string]*framework.Component{}
	for _, name := range []string{"containerd", "kube-apiserver", "etcd"} {
		r.comps[name] = s.Component(t, name)
	}
	r.setProc("sandman-vk", p.vk.cmd.Process.Pid)
	for _, a := range p.agents {
		r.setProc("sandman-node "+a.name, a.proc.cmd.Process.Pid)
	}
	for name, c := range r.comps {
		r.setProc(name, c.Pid())
	}

	ctx := t.Context()
	if err := r.fillRound(ctx, "warmup"); err != nil {
		t.Fatalf("warm-up: %v", err)
	}
	r.warmBefore = map[string]int{}
	for _, a := range p.agents {
		r.warmBefore[a.name] = r.cfg.Slots
	}
	if err := waitAllWarm(ctx, r.agentsForCensus(), r.warmBefore, 2*time.Minute); err != nil {
		t.Fatalf("after the warm-up: %v", err)
	}
	before, err := takeSoakCensus(ctx, s, r.agentsForCensus(), p.node)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range before {
		if e.Err != "" {
			t.Fatalf("census before the churn: %s: %s", e.Name, e.Err)
		}
	}
	r.censusBefore = before
}

// fillRound binds every slot of every agent once: as many sandboxes as
// the pool has slots, each Ready and answering, then deleted. The census
// is taken after one at both ends, so both see every slot made (an agent
// restarted mid-bind drops that slot; the refiller makes only --warm-slots
// ahead, binds make the rest on demand) and the image on every agent.
func (r *churnRun) fillRound(ctx context.Context, prefix string) error {
	pods := r.s.Kube.CoreV1().Pods(r.p.ns)
	sel := metav1.ListOptions{LabelSelector: soakRole + "=warmup"}
	for i := range r.capacity {
		pod := r.p.newPod(fmt.Sprintf("%s-%02d", prefix, i), r.s.BusyboxImage, func(pod *corev1.Pod) { pod.Labels[soakRole] = "warmup" })
		if _, err := r.createPod(ctx, pod); err != nil {
			return err
		}
	}
	var waiting []string
	deadline := time.Now().Add(5 * time.Minute)
	for {
		waiting = waiting[:0]
		l, err := pods.List(ctx, sel)
		if err != nil {
			waiting = append(waiting, err.Error())
		} else {
			for _, p := range l.Items {
				if !podReady(&p) {
					waiting = append(waiting, p.Name+": "+describe(&p))
					continue
				}
				c, err := client.New(fmt.Sprintf("%s:%d", p.Status.PodIP, api.Port), client.WithToken(trainerToken), client.WithHTTPClient(r.hc))
				if err == nil {
					ectx, cancel := context.WithTimeout(ctx, callTimeout)
					_, err = c.Exec(ectx, api.ExecRequest{Cmd: []string{"true"}})
					cancel()
				}
				if err != nil {
					waiting = append(waiting, p.Name+": daemon: "+err.Error())
				}
			}
		}
		if len(waiting) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		sleepCtx(ctx, time.Second)
	}
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{}, sel); err != nil {
		return fmt.Errorf("delete the %s sandboxes: %w", prefix, err)
	}
	if len(waiting) > 0 {
		return fmt.Errorf("%d of %d %s sandboxes not Ready and answering in 5m, e.g. %s", len(waiting), r.capacity, prefix, waiting[0])
	}
	deadline = time.Now().Add(2 * time.Minute)
	for {
		l, err := pods.List(ctx, sel)
		if err == nil && len(l.Items) == 0 {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("the %s sandboxes not gone 2m after their delete (%v)", prefix, err)
		}
		sleepCtx(ctx, time.Second)
	}
}

func (r *churnRun) setProc(name string, pid int) {
	r.procMu.Lock()
	defer r.procMu.Unlock()
	pr, ok := r.procs[name]
	if ok && pr.pid != pid {
		pr.gen++
	}
	pr.pid = pid
	r.procs[name] = pr
}

func (r *churnRun) problem(format string, a ...any) {
	msg := fmt.Sprintf(format, a...)
	r.t.Logf("soak: %s", msg)
	r.mu.Lock()
	r.problems = append(r.problems, msg)
	r.mu.Unlock()
}

// run is the churn: creators, sandboxes and the sampler in goroutines,
// the fault scheduler in the test's goroutine (it may fail the test), then
// the checks.
func (r *churnRun) run() {
	r.start = time.Now()
	base := context.WithoutCancel(r.t.Context())
	r.workCtx, r.cancelWork = context.WithCancel(base)
	r.sampleCtx, r.cancelSample = context.WithCancel(base)
	r.createCtx, r.cancelCreate = context.WithDeadline(base, r.start.Add(r.cfg.Duration))
	go r.watch.run(r.workCtx, r.s, r.p.ns)
	go r.sampler(r.sampleCtx)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		r.creator(r.createCtx)
	}()
	r.runFaults(r.start.Add(r.cfg.Duration - r.cfg.Tail))
	<-r.createCtx.Done()
	r.finish()
}

// creator makes sandboxes: one every CreateEvery while fewer than the
// pool's slots are live, and bursts at random times or when a fault asks.
func (r *churnRun) creator(ctx context.Context) {
	defer r.closeGroups()
	rng := r.cfg.rng(2)
	tick := time.NewTicker(r.cfg.CreateEvery)
	defer tick.Stop()
	nextBurst := func() <-chan time.Time {
		return time.After(time.Minute + time.Duration(rng.Int64N(int64(3*time.Minute))))
	}
	burstAt := nextBurst()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if r.live.Load() < int64(r.capacity) {
				r.spawn(ctx, rng, false)
			}
		case <-burstAt:
			r.spawnBurst(ctx, rng)
			burstAt = nextBurst()
		case <-r.burst:
			r.spawnBurst(ctx, rng)
		}
	}
}

func (r *churnRun) spawnBurst(ctx context.Context, rng *rand.Rand) {
	n := r.capacity/2 + rng.IntN(r.capacity+1)
	r.t.Logf("soak: burst of %d sandboxes at +%v", n, time.Since(r.start).Round(time.Second))
	r.mu.Lock()
	r.bursts++
	r.burstN += n
	r.mu.Unlock()
	for range n {
		r.spawn(ctx, rng, true)
	}
}

func (r *churnRun) spawn(ctx context.Context, rng *rand.Rand, burst bool) {
	seq := r.seq.Add(1)
	plan := r.planFor(seq)
	var g *ownerGroup
	if plan.mode == modeOwner {
		if g = r.joinGroup(ctx, rng); g == nil {
			plan.mode = modeDelete
		}
	}
	r.live.Add(1)
	r.wg.Add(1)
	go r.sandbox(seq, plan, g, burst)
}

func (r *churnRun) planFor(seq int64) sandboxPlan {
	rng := r.cfg.rng(1000 + uint64(seq))
	p := sandboxPlan{rounds: 2 + rng.IntN(5), token: fmt.Sprintf("soak-%d-%016x", seq, rng.Uint64())}
	switch x := rng.Float64(); {
	case x < 0.4:
		p.mode = modeDelete
	case x < 0.6:
		p.mode = modeOwner
	case x < 0.8:
		p.mode = modeIdle
	default:
		p.mode = modeDeadline
		p.deadline = 30 + rng.Int64N(31)
	}
	for range p.rounds {
		// 1 KiB to 1 MiB, evenly on a log scale.
		p.sizes = append(p.sizes, int(1024*math.Exp(rng.Float64()*math.Log(1024))))
		p.pauses = append(p.pauses, 200*time.Millisecond+time.Duration(rng.Int64N(int64(1800*time.Millisecond))))
	}
	for i := range p.dataSeed {
		p.dataSeed[i] = byte(rng.Uint32())
	}
	return p
}

// sandbox is one sandbox's life: created, Ready, rounds of file writes,
// reads and commands through its daemon, and its planned end.
func (r *churnRun) sandbox(seq int64, plan sandboxPlan, g *ownerGroup, burst bool) {
	defer r.wg.Done()
	defer r.live.Add(-1)
	ctx := r.workCtx
	rec := &sandboxRecord{Name: fmt.Sprintf("soak-%05d", seq), Mode: plan.mode, Burst: burst, Spawned: time.Now()}
	defer func() {
		rec.Ended = time.Now()
		r.mu.Lock()
		r.sandboxes = append(r.sandboxes, rec)
		r.mu.Unlock()
	}()
	groupDone := func() {}
	if g != nil {
		rec.Owner = g.name
		groupDone = sync.OnceFunc(func() { r.groupDone(g) })
		defer groupDone()
	}
	sum := sha256.Sum256([]byte(plan.token))
	pod := r.p.newPod(rec.Name, r.s.BusyboxImage, func(pod *corev1.Pod) {
		pod.Labels[soakRole] = "sandbox"
		pod.Labels["sandman.io/job"] = "soak"
		pod.Labels["soak.sandman.io/mode"] = plan.mode
		pod.Annotations["sandman.io/token-sha256"] = hex.EncodeToString(sum[:])
		grace := int64(1)
		pod.Spec.TerminationGracePeriodSeconds = &grace
		switch plan.mode {
		case modeIdle:
			pod.Annotations["sandman.io/idle-timeout"] = idleTimeout.String()
		case modeDeadline:
			pod.Spec.ActiveDeadlineSeconds = &plan.deadline
		case modeOwner:
			pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Pod", Name: g.name, UID: g.uid}}
		}
	})
	created, err := r.createPod(ctx, pod)
	if err != nil {
		rec.Result, rec.Detail = "not created", err.Error()
		return
	}
	rec.Created = time.Now()
	uid := created.UID
	deadlineAt := created.CreationTimestamp.Add(time.Duration(plan.deadline) * time.Second)
	rec.note("created (uid %s, mode %s, %d rounds)", uid, plan.mode, plan.rounds)

	ready, ok := r.waitPod(ctx, rec.Name, uid, readyTimeout, func(p *corev1.Pod) bool {
		return p == nil || terminal(p) || (podReady(p) && p.Status.PodIP != "")
	})
	switch {
	case ctx.Err() != nil:
		rec.Result = "soak stopped"
		return
	case !ok:
		r.endUnplanned(ctx, rec, uid, "not Ready in "+readyTimeout.String(), describe(ready))
		return
	case ready == nil:
		r.endUnplanned(ctx, rec, uid, "gone before Ready", "")
		return
	case terminal(ready) && plan.mode == modeDeadline && ready.Status.Reason == "DeadlineExceeded":
		// The deadline counts from creation: it may pass while the pod
		// waits for a slot (a burst larger than the pool).
		rec.note("Failed DeadlineExceeded before Ready: %s", ready.Status.Message)
		if err := r.deletePod(ctx, rec.Name, uid); err != nil {
			r.endUnplanned(ctx, rec, uid, "delete refused", err.Error())
			return
		}
		r.expectGone(ctx, rec, uid, 3*time.Minute, "Failed DeadlineExceeded before Ready, then deleted")
		return
	case terminal(ready):
		r.endUnplanned(ctx, rec, uid, endedAs(ready)+" before Ready", ready.Status.Message)
		return
	}
	rec.Ready, rec.IP = time.Now(), ready.Status.PodIP
	rec.note("Ready at %s", rec.IP)

	c, err := client.New(fmt.Sprintf("%s:%d", rec.IP, api.Port), client.WithToken(plan.token), client.WithHTTPClient(r.hc))
	if err != nil {
		r.endUnplanned(ctx, rec, uid, "no daemon client", err.Error())
		return
	}
	data := rand.NewChaCha8(plan.dataSeed)
	fails := 0
	for i := range plan.rounds {
		if plan.mode == modeDeadline && time.Until(deadlineAt) < 15*time.Second {
			rec.note("deadline near: no more calls")
			break
		}
		if why := r.notRunning(rec.Name, uid); why != "" {
			r.endUnplanned(ctx, rec, uid, why, "")
			return
		}
		if r.round(ctx, rec, c, data, i, plan.sizes[i]) {
			rec.Rounds++
			fails = 0
		} else {
			if ctx.Err() != nil {
				rec.Result = "soak stopped"
				return
			}
			fails++
			// Give the pod list a moment to show what happened.
			sleepCtx(ctx, 2*time.Second)
			if why := r.notRunning(rec.Name, uid); why != "" {
				r.endUnplanned(ctx, rec, uid, why, "")
				return
			}
			if fails == 3 {
				r.endUnplanned(ctx, rec, uid, "daemon failing while its pod runs", "3 rounds in a row failed")
				return
			}
		}
		sleepCtx(ctx, plan.pauses[i])
	}

	switch plan.mode {
	case modeDelete:
		if err := r.deletePod(ctx, rec.Name, uid); err != nil {
			r.endUnplanned(ctx, rec, uid, "delete refused", err.Error())
			return
		}
		r.expectGone(ctx, rec, uid, 3*time.Minute, "deleted by the trainer")
	case modeOwner:
		groupDone()
		// The owner goes once every sandbox of its group is done, and one
		// may still be waiting for a slot.
		r.expectGone(ctx, rec, uid, readyTimeout+5*time.Minute, "deleted with its owner (garbage collector)")
	case modeIdle:
		r.expectGone(ctx, rec, uid, idleTimeout+3*time.Minute, "reclaimed by the idle lease")
	case modeDeadline:
		last, ok := r.waitPod(ctx, rec.Name, uid, time.Until(deadlineAt)+2*time.Minute, func(p *corev1.Pod) bool {
			return p == nil || (terminal(p) && p.DeletionTimestamp == nil)
		})
		switch {
		case ctx.Err() != nil:
			rec.Result = "soak stopped"
		case !ok:
			r.endUnplanned(ctx, rec, uid, "deadline not enforced", describe(last))
		case last == nil:
			r.endUnplanned(ctx, rec, uid, "gone before its deadline", "")
		case last.Status.Reason != "DeadlineExceeded":
			r.endUnplanned(ctx, rec, uid, endedAs(last)+" before its deadline", last.Status.Message)
		default:
			rec.note("Failed DeadlineExceeded: %s", last.Status.Message)
			if err := r.deletePod(ctx, rec.Name, uid); err != nil {
				r.endUnplanned(ctx, rec, uid, "delete refused", err.Error())
				return
			}
			r.expectGone(ctx, rec, uid, 3*time.Minute, "Failed DeadlineExceeded, then deleted")
		}
	}
}

// round writes a file, reads it back and runs a command that prints the
// sandbox's hostname and the file's checksum.
func (r *churnRun) round(ctx context.Context, rec *sandboxRecord, c *client.Client, data *rand.ChaCha8, i, size int) bool {
	path := fmt.Sprintf("/tmp/soak-%d.bin", i)
	buf := make([]byte, size)
	_, _ = data.Read(buf)
	sum := sha256.Sum256(buf)
	if !r.call(ctx, rec, "file write", func(ctx context.Context) (string, error) {
		_, err := c.WriteFile(ctx, path, bytes.NewReader(buf), 0o644)
		return "", err
	}) {
		return false
	}
	if !r.call(ctx, rec, "file read", func(ctx context.Context) (string, error) {
		rc, err := c.ReadFile(ctx, path)
		if err != nil {
			return "", err
		}
		defer rc.Close()
		got, err := io.ReadAll(rc)
		if err != nil {
			return "", fmt.Errorf("read %s: %w", path, err)
		}
		if !bytes.Equal(got, buf) {
			return fmt.Sprintf("read %s: %d bytes (sha256 %x), wrote %d (sha256 %x)", path, len(got), sha256.Sum256(got), len(buf), sum), nil
		}
		return "", nil
	}) {
		return false
	}
	want := fmt.Sprintf("%s\n%x  %s\n", rec.Name, sum, path)
	return r.call(ctx, rec, "exec", func(ctx context.Context) (string, error) {
		res, err := c.Exec(ctx, api.ExecRequest{Cmd: []string{"sh", "-c", `hostname && sha256sum "$1"`, "sh", path}})
		if err != nil {
			return "", err
		}
		if res.ExitCode != 0 || string(res.Stdout) != want {
			return fmt.Sprintf("exec: exit %d, stdout %q, stderr %q; want stdout %q", res.ExitCode, res.Stdout, res.Stderr, want), nil
		}
		return "", nil
	})
}

// call runs one daemon call and records it. f returns a non-empty wrong
// when the call answered with the wrong content.
func (r *churnRun) call(ctx context.Context, rec *sandboxRecord, op string, f func(context.Context) (wrong string, err error)) bool {
	start := time.Now()
	cctx, cancel := context.WithTimeout(ctx, callTimeout)
	wrong, err := f(cctx)
	cancel()
	if err != nil && ctx.Err() != nil {
		return false // the soak is stopping: not the daemon's failure
	}
	c := soakreport.Call{Start: start, End: time.Now(), Sandbox: rec.Name, Op: op}
	switch {
	case err != nil:
		c.Err = err.Error()
		rec.note("%s failed: %v", op, err)
	case wrong != "":
		c.Err, c.Wrong = wrong, true
		rec.note("%s answered wrongly: %s", op, wrong)
	}
	r.mu.Lock()
	r.calls = append(r.calls, c)
	r.mu.Unlock()
	return !c.Failed()
}

// endUnplanned records an end other than the plan and removes what is
// left of the pod.
func (r *churnRun) endUnplanned(ctx context.Context, rec *sandboxRecord, uid types.UID, result, detail string) {
	rec.Result, rec.Detail = result, detail
	rec.note("ended unplanned: %s %s", result, detail)
	if ctx.Err() != nil {
		return
	}
	if err := r.deletePod(ctx, rec.Name, uid); err != nil {
		rec.note("delete: %v", err)
		return
	}
	if last, ok := r.waitPod(ctx, rec.Name, uid, 3*time.Minute, func(p *corev1.Pod) bool { return p == nil }); !ok {
		rec.note("still there 3m after its delete: %s", describe(last))
	}
}

// expectGone waits for the planned end: the pod gone.
func (r *churnRun) expectGone(ctx context.Context, rec *sandboxRecord, uid types.UID, timeout time.Duration, result string) {
	// A pod being deleted may show its final status (ended) before it goes.
	last, ok := r.waitPod(ctx, rec.Name, uid, timeout, func(p *corev1.Pod) bool {
		return p == nil || (terminal(p) && p.DeletionTimestamp == nil)
	})
	switch {
	case ctx.Err() != nil:
		rec.Result = "soak stopped"
	case !ok:
		r.endUnplanned(ctx, rec, uid, "not gone in "+timeout.String()+" (expected: "+result+")", describe(last))
	case last != nil:
		r.endUnplanned(ctx, rec, uid, endedAs(last)+" (expected: "+result+")", last.Status.Message)
	default:
		rec.Result, rec.AsPlanned = result, true
		rec.note("%s", result)
	}
}

// joinGroup adds an owner-mode sandbox to the open owner group, making a
// new owner pod when none is open; nil when no owner could be made. Only
// the creator calls it.
func (r *churnRun) joinGroup(ctx context.Context, rng *rand.Rand) *ownerGroup {
	r.mu.Lock()
	if g := r.group; g != nil && !g.closed {
		g.members++
		g.closed = g.members == g.size
		r.mu.Unlock()
		return g
	}
	n := len(r.groups)
	r.mu.Unlock()
	owner := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("soak-owner-%03d", n), Namespace: r.p.ns,
			Labels: map[string]string{soakRole: "owner"}},
		Spec: corev1.PodSpec{NodeSelector: map[string]string{"sandman.io/pool": "nowhere"},
			Containers: []corev1.Container{{Name: "trainer", Image: r.s.BusyboxImage}}},
	}
	created, err := r.createPod(ctx, owner)
	if err != nil {
		r.t.Logf("soak: owner pod %s: %v; its sandbox is deleted by the trainer instead", owner.Name, err)
		return nil
	}
	g := &ownerGroup{name: created.Name, uid: created.UID, size: 2 + rng.IntN(4), members: 1}
	r.mu.Lock()
	r.groups = append(r.groups, g)
	r.group = g
	r.mu.Unlock()
	return g
}

// groupDone: a member has done its work; the last one's deletes the owner.
func (r *churnRun) groupDone(g *ownerGroup) {
	r.mu.Lock()
	g.done++
	del := g.closed && g.done == g.members && !g.deleting
	g.deleting = g.deleting || del
	r.mu.Unlock()
	if del {
		r.deleteOwner(g)
	}
}

// closeGroups: creating has stopped; groups whose members are all done
// lose their owner now.
func (r *churnRun) closeGroups() {
	var del []*ownerGroup
	r.mu.Lock()
	for _, g := range r.groups {
		g.closed = true
		if g.done == g.members && !g.deleting {
			g.deleting = true
			del = append(del, g)
		}
	}
	r.mu.Unlock()
	for _, g := range del {
		r.deleteOwner(g)
	}
}

func (r *churnRun) deleteOwner(g *ownerGroup) {
	if err := r.deletePod(r.workCtx, g.name, g.uid); err != nil {
		r.problem("owner pod %s not deleted: %v", g.name, err)
	}
}

// outcomes sorts the sandboxes into the report's rows.
func (r *churnRun) outcomes(recs []*sandboxRecord, windows []soakreport.Window) ([]soakreport.Outcome, []*sandboxRecord) {
	type key struct{ mode, result, verdict string }
	counts := map[key]int{}
	var unexpected []*sandboxRecord
	for _, rec := range recs {
		v := soakreport.AsPlanned
		if !rec.AsPlanned {
			from := rec.Spawned
			if _, ok := soakreport.Covering(windows, from, rec.Ended, windowSlack); ok {
				v = soakreport.InFaultWindow
			} else {
				v = soakreport.Unexpected
				unexpected = append(unexpected, rec)
			}
		}
		counts[key{rec.Mode, rec.Result, v}]++
	}
	keys := slices.Collect(maps.Keys(counts))
	slices.SortFunc(keys, func(a, b key) int {
		return strings.Compare(a.mode+"\x00"+a.verdict+"\x00"+a.result, b.mode+"\x00"+b.verdict+"\x00"+b.result)
	})
	var out []soakreport.Outcome
	for _, k := range keys {
		out = append(out, soakreport.Outcome{Mode: k.mode, Result: k.result, Verdict: k.verdict, N: counts[k]})
	}
	return out, unexpected
}

//go:build soak && e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"syscall"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandman-dev/sandman/e2e/soakreport"
)

// faultNames are the fault log's names of the kinds.
var faultNames = map[string]string{
	faultVK: "kill sandman-vk", faultAgent: "kill node agent", faultContainerd: "kill containerd",
	faultAPIServer: "kill kube-apiserver", faultEtcd: "kill etcd", faultAgentStop: "stop node agent",
}

// faultEstimate is about how long each kind takes, recovery included; the
// scheduler shares the time left among the gaps with it.
var faultEstimate = map[string]time.Duration{
	faultVK: 15 * time.Second, faultAgent: 20 * time.Second, faultContainerd: 30 * time.Second,
	faultAPIServer: 45 * time.Second, faultEtcd: 45 * time.Second, faultAgentStop: poolBindTimeout + time.Minute,
}

// component of each stack fault.
var faultComponent = map[string]string{faultContainerd: "containerd", faultAPIServer: "kube-apiserver", faultEtcd: "etcd"}

const recoveryTimeout = 5 * time.Minute

// runFaults injects the planned faults one at a time, at random gaps,
// from the end of the warm-up and baseline until lastStart.
func (r *churnRun) runFaults(lastStart time.Time) {
	rng := r.cfg.rng(1)
	plan := soakreport.PlanFaults(rng, r.cfg.faultPlanKinds(), 1)
	r.t.Logf("soak: fault plan %v", plan)
	sleepCtx(r.workCtx, time.Until(r.start.Add(r.cfg.Warmup+r.cfg.Window)))
	for i, kind := range plan {
		var est time.Duration
		for _, k := range plan[i:] {
			est += faultEstimate[k]
		}
		gap := soakreport.NextGap(rng, time.Until(lastStart), est, len(plan)-i, 10*time.Second)
		if time.Now().Add(gap).After(lastStart) || r.workCtx.Err() != nil {
			for _, k := range plan[i:] {
				r.skipped = append(r.skipped, faultNames[k])
			}
			r.t.Logf("soak: no time left for %d planned faults", len(plan)-i)
			return
		}
		sleepCtx(r.workCtx, gap)
		r.revive() // a process that died outside a fault (reported by the sampler)
		w := r.inject(kind, rng)
		r.mu.Lock()
		r.windows = append(r.windows, w)
		r.mu.Unlock()
		r.t.Logf("soak: fault %d/%d at +%v: %s %s; restored after %v, recovered after %v %s %s", i+1, len(plan),
			w.Start.Sub(r.start).Round(time.Second), w.Kind, w.Target, w.Restored.Sub(w.Start).Round(100*time.Millisecond),
			w.End.Sub(w.Start).Round(100*time.Millisecond), w.Detail, w.Err)
	}
}

// inject runs one fault and waits for the recovery.
func (r *churnRun) inject(kind string, rng *rand.Rand) soakreport.Window {
	t, p := r.t, r.p
	r.faulting.Store(true)
	defer r.faulting.Store(false)
	w := soakreport.Window{Kind: faultNames[kind]}
	down := time.Duration(rng.Int64N(int64(10 * time.Second)))
	if kind == faultAPIServer || kind == faultEtcd {
		down = 5*time.Second + time.Duration(rng.Int64N(int64(25*time.Second)))
	}
	switch kind {
	case faultVK:
		old := p.vk.cmd.Process.Pid
		w.Start = time.Now()
		p.killVK()
		sleepCtx(r.workCtx, down)
		a, err := r.launch("sandman-vk", p.vkBin, p.vkArgs)
		if err != nil {
			t.Fatalf("restart sandman-vk: %v", err)
		}
		p.vk = a
		r.setProc("sandman-vk", a.cmd.Process.Pid)
		w.Target = fmt.Sprintf("sandman-vk (pid %d → %d)", old, a.cmd.Process.Pid)
	case faultAgent:
		ag := p.agents[rng.IntN(len(p.agents))]
		old := ag.proc.cmd.Process.Pid
		w.Start = time.Now()
		_ = ag.proc.cmd.Process.Signal(syscall.SIGKILL)
		<-ag.proc.done
		sleepCtx(r.workCtx, down)
		a, err := r.launch("sandman-node-"+ag.name, r.nodeBin, ag.args)
		if err != nil {
			t.Fatalf("restart node agent %s: %v", ag.name, err)
		}
		ag.proc = a
		r.setProc("sandman-node "+ag.name, a.cmd.Process.Pid)
		w.Target = fmt.Sprintf("%s (pid %d → %d)", ag.name, old, a.cmd.Process.Pid)
	case faultAgentStop:
		ag := p.agents[rng.IntN(len(p.agents))]
		down = poolBindTimeout + 10*time.Second + time.Duration(rng.Int64N(int64(20*time.Second)))
		w.Start = time.Now()
		if err := ag.proc.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatalf("SIGSTOP %s: %v", ag.name, err)
		}
		r.stopped = ag
		// Binds in flight to the stopped agent outlast the bind timeout.
		select {
		case r.burst <- struct{}{}:
		default:
		}
		sleepCtx(r.workCtx, down)
		_ = ag.proc.cmd.Process.Signal(syscall.SIGCONT)
		r.stopped = nil
		w.Target = fmt.Sprintf("%s (pid %d)", ag.name, ag.proc.cmd.Process.Pid)
		w.Detail = "with a burst of sandboxes"
	default:
		name := faultComponent[kind]
		c := r.comps[name]
		old := c.Pid()
		w.Start = time.Now()
		c.Kill(t)
		sleepCtx(r.workCtx, down)
		c.Start(t)
		r.setProc(name, c.Pid())
		w.Target = fmt.Sprintf("%s (pid %d → %d)", name, old, c.Pid())
	}
	w.Restored = time.Now()
	w.Detail = strings.TrimSpace(fmt.Sprintf("down %v %s", down.Round(100*time.Millisecond), w.Detail))
	var why string
	w.End, why = r.recover(recoveryTimeout)
	if why != "" {
		w.Err = why
	}
	return w
}

// recover waits until the system has converged after a fault, or timeout
// passes; it returns when, and what was still wrong on timeout.
func (r *churnRun) recover(timeout time.Duration) (time.Time, string) {
	deadline := time.Now().Add(timeout)
	for {
		r.revive()
		ctx, cancel := context.WithTimeout(r.workCtx, 20*time.Second)
		why := r.converged(ctx)
		cancel()
		if why == "" {
			return time.Now(), ""
		}
		if time.Now().After(deadline) || r.workCtx.Err() != nil {
			return time.Now(), fmt.Sprintf("not converged in %v: %s", timeout, why)
		}
		sleepCtx(r.workCtx, time.Second)
	}
}

// converged says what keeps the system from having recovered: the
// apiserver not ready, containerd not answering, sandman-vk not healthy or
// not following every agent, an agent not answering, or a slot holding a
// pod that ended or is gone (a fault's sandboxes not yet released).
// Empty when none.
func (r *churnRun) converged(ctx context.Context) string {
	if _, err := r.s.Kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx); err != nil {
		return "kube-apiserver not ready: " + err.Error()
	}
	if err := containerdAnswers(ctx, r.s.ContainerdAddress); err != nil {
		return "containerd: " + err.Error()
	}
	if _, err := getOK(ctx, "http://"+r.p.metrics+"/healthz"); err != nil {
		return "sandman-vk: " + err.Error()
	}
	metrics, err := getOK(ctx, "http://"+r.p.metrics+"/metrics")
	if err != nil {
		return "sandman-vk: " + err.Error()
	}
	for _, a := range r.p.agents {
		if !strings.Contains(metrics, fmt.Sprintf(`sandman_pool_node_healthy{node=%q} 1`, a.name)) {
			return "sandman-vk does not see node agent " + a.name + " healthy"
		}
	}
	slots, down := r.boundSlots(ctx)
	if len(down) > 0 {
		return "node agent not answering: " + strings.Join(down, "; ")
	}
	l, err := r.s.Kube.CoreV1().Pods(r.p.ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		return "list pods: " + err.Error()
	}
	var pods []soakreport.PodState
	for _, p := range l.Items {
		pods = append(pods, soakreport.PodState{UID: string(p.UID), Name: p.Name, Terminal: terminal(&p)})
	}
	if o := soakreport.Orphans(slots, pods); len(o) > 0 {
		return fmt.Sprintf("%d slots hold pods that ended or are gone, e.g. %s", len(o), o[0])
	}
	return ""
}

// getOK fetches u and fails unless the answer is 200.
func getOK(ctx context.Context, u string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("GET %s: %s: %s", u, resp.Status, strings.TrimSpace(string(b)))
	}
	return string(b), err
}

func containerdAnswers(ctx context.Context, address string) error {
	c, err := containerd.New(address, containerd.WithTimeout(5*time.Second))
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Version(ctx)
	return err
}

// revive starts again any process of the stack or the pool that is not
// running (after a fault's restart, none should be) and says which. A
// sandman process that exited is a finding; a stack process is noted (the
// control plane's own behaviour, e.g. an apiserver giving up on etcd). An
// agent under SIGSTOP is not dead.
func (r *churnRun) revive() []string {
	var notes []string
	for _, name := range []string{"etcd", "kube-apiserver", "containerd"} {
		if c := r.comps[name]; !c.Running() {
			c.Start(r.t)
			r.setProc(name, c.Pid())
			r.t.Logf("soak: %s was not running at +%v: started again", name, time.Since(r.start).Round(time.Second))
		}
	}
	select {
	case <-r.p.vk.done:
		if a, err := r.launch("sandman-vk", r.p.vkBin, r.p.vkArgs); err == nil {
			r.p.vk = a
			r.setProc("sandman-vk", a.cmd.Process.Pid)
			notes = append(notes, "sandman-vk had exited: started again")
			r.problem("at +%v sandman-vk had exited by itself; started again", time.Since(r.start).Round(time.Second))
		}
	default:
	}
	for _, ag := range r.p.agents {
		select {
		case <-ag.proc.done:
			if a, err := r.launch("sandman-node-"+ag.name, r.nodeBin, ag.args); err == nil {
				ag.proc = a
				r.setProc("sandman-node "+ag.name, a.cmd.Process.Pid)
				notes = append(notes, "node agent "+ag.name+" had exited: started again")
				r.problem("at +%v node agent %s had exited by itself; started again", time.Since(r.start).Round(time.Second), ag.name)
			}
		default:
		}
	}
	return notes
}

// restore leaves the stack whole when the soak ends early: a stopped
// agent continued, every process running again.
func (r *churnRun) restore() {
	if ag := r.stopped; ag != nil {
		_ = ag.proc.cmd.Process.Signal(syscall.SIGCONT)
		r.stopped = nil
	}
	if r.comps == nil || r.p == nil {
		return
	}
	if notes := r.revive(); len(notes) > 0 {
		r.t.Logf("soak: restored: %s", strings.Join(notes, "; "))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for ctx.Err() == nil {
		_, err := r.s.Kube.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(ctx)
		if err == nil && containerdAnswers(ctx, r.s.ContainerdAddress) == nil {
			return
		}
		sleepCtx(ctx, time.Second)
	}
	r.t.Errorf("soak: the stack did not answer again within 2m after the restore")
}

// stuckPods lists the pods that, with the churn stopped, are neither
// Ready, nor ended with a reason, nor gone (nor, for the owners, deleted),
// polling until none is left or timeout passes.
func (r *churnRun) stuckPods(timeout time.Duration) []string {
	ctx := context.WithoutCancel(r.t.Context())
	deadline := time.Now().Add(timeout)
	for {
		var stuck []string
		l, err := r.s.Kube.CoreV1().Pods(r.p.ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			stuck = []string{"list pods: " + err.Error()}
		} else {
			for _, p := range l.Items {
				if why := stuckWhy(&p); why != "" {
					stuck = append(stuck, p.Name+": "+why)
				}
			}
		}
		if len(stuck) == 0 || time.Now().After(deadline) {
			return stuck
		}
		sleepCtx(ctx, 2*time.Second)
	}
}

func stuckWhy(p *corev1.Pod) string {
	switch {
	case p.Labels[soakRole] == "owner":
		return "owner pod not deleted though its sandboxes are done"
	case p.DeletionTimestamp != nil && time.Since(p.DeletionTimestamp.Time) > time.Minute:
		return "deleting for " + time.Since(p.DeletionTimestamp.Time).Round(time.Second).String() + ": " + describe(p)
	case p.DeletionTimestamp != nil:
		return "" // going
	case p.Status.Phase == corev1.PodSucceeded:
		return ""
	case p.Status.Phase == corev1.PodFailed:
		if endedAs(p) == string(corev1.PodFailed) {
			return "Failed without a reason: " + describe(p)
		}
		return ""
	case podReady(p):
		return ""
	}
	return "neither Ready nor ended: " + describe(p)
}

//go:build soak && e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandman-dev/sandman/e2e/soakreport"
)

// persistentDouble is how long a double binding may be seen before it
// fails the soak (a bind the pool gave up on that completed later is
// released within seconds).
const persistentDouble = 30 * time.Second

// drainTimeout bounds how long the sandboxes still running when creating
// stops may take to end as planned (normally a minute or two; a sandbox
// may wait readyTimeout for a slot, and its group's owner for the others).
const drainTimeout = 20 * time.Minute

// churnEnd is what the end of the run found.
type churnEnd struct {
	stuck, finalDoubles []string
	cleanupErr, warmErr error
	after               soakreport.Census
	leaks               []soakreport.Delta
	endFrom             time.Time
}

// finish stops the churn and checks what it left: stuck pods, double
// bindings, the census and memory; then writes the report and fails the
// test for each finding.
func (r *churnRun) finish() {
	t := r.t
	r.stop = time.Now()
	t.Logf("soak: creating stopped at +%v; %d sandboxes still finishing", r.stop.Sub(r.start).Round(time.Second), r.live.Load())
	if !waitTimeout(&r.wg, drainTimeout) {
		r.problem("%d sandboxes still running %v after creating stopped: stopped", r.live.Load(), drainTimeout)
		r.cancelWork()
		waitTimeout(&r.wg, time.Minute)
	}
	r.revive()
	ctx := context.WithoutCancel(t.Context())
	var e churnEnd
	e.stuck = r.stuckPods(3 * time.Minute)
	slots, down := r.boundSlots(ctx)
	e.finalDoubles = soakreport.DoubleBound(slots)
	for _, d := range down {
		r.problem("node agent not answering once the churn stopped (bindings not checked): %s", d)
	}
	r.cancelWork()

	// Remove what is left (nothing, unless a sandbox was stuck), then the
	// census must equal the one after warm-up.
	e.cleanupErr = r.deleteAll(ctx, 3*time.Minute)
	if err := r.fillRound(ctx, "refill"); err != nil {
		r.problem("every slot bound once more after the churn: %v", err)
	}
	e.warmErr = waitAllWarm(ctx, r.agentsForCensus(), r.warmBefore, 3*time.Minute)
	e.after, e.leaks = settleCensus(ctx, r.s, r.agentsForCensus(), r.p.node, r.censusBefore, 3*time.Minute)

	// The end value of memory: samples with everything settled.
	e.endFrom = time.Now()
	sleepCtx(ctx, max(30*time.Second, 4*r.cfg.Sample))
	r.cancelSample()
	<-r.sampled
	r.finished = true
	r.report(e)
}

// abort runs when the test stops before finish (a t.Fatal): it restores
// the stack, stops the churn and writes what was recorded.
func (r *churnRun) abort() {
	if r.finished || r.cancelWork == nil {
		r.restore()
		return
	}
	r.finished = true
	r.t.Log("soak: stopped early; restoring the stack and writing what was recorded")
	r.cancelCreate()
	r.restore()
	r.cancelWork()
	waitTimeout(&r.wg, time.Minute)
	r.cancelSample()
	<-r.sampled
	if r.stop.IsZero() {
		r.stop = time.Now()
	}
	r.problem("the soak stopped before its end: see the test's failure")
	r.report(churnEnd{endFrom: time.Now()})
}

// deleteAll deletes every pod left in the pool's namespace and waits for
// them to be gone.
func (r *churnRun) deleteAll(ctx context.Context, timeout time.Duration) error {
	pods := r.s.Kube.CoreV1().Pods(r.p.ns)
	if err := pods.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		return fmt.Errorf("delete the pods left: %w", err)
	}
	deadline := time.Now().Add(timeout)
	for {
		l, err := pods.List(ctx, metav1.ListOptions{})
		if err == nil && len(l.Items) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			var left []string
			if err == nil {
				for _, p := range l.Items {
					left = append(left, p.Name+" ("+describe(&p)+")")
				}
			}
			return fmt.Errorf("pods left %v after deleting them: %v %v", timeout, err, left)
		}
		sleepCtx(ctx, time.Second)
	}
}

func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
		return true
	case <-time.After(d):
		return false
	}
}

// report judges the run, writes the report and the raw data, and fails
// the test for each finding.
func (r *churnRun) report(e churnEnd) {
	t := r.t
	r.mu.Lock()
	windows := slices.Clone(r.windows)
	calls := slices.Clone(r.calls)
	recs := slices.Clone(r.sandboxes)
	samples := slices.Clone(r.samples)
	problems := slices.Clone(r.problems)
	c := &soakreport.Churn{
		Start: r.start, Stop: r.stop, Done: time.Now(), Faults: windows, Skipped: slices.Clone(r.skipped),
		Creates: r.creates, CreateErrors: r.createErrs, CreateErrorSamples: slices.Clone(r.createErrSamples),
		Bursts: r.bursts, BurstSandboxes: r.burstN,
		Stuck: e.stuck, CensusBefore: r.censusBefore, CensusAfter: e.after, Plot: "reliability-rss.svg",
	}
	var transient []string
	for d, sp := range r.doubles {
		line := fmt.Sprintf("%s, seen %d times over %v from +%v", d, sp.n, sp.last.Sub(sp.first).Round(time.Second), sp.first.Sub(r.start).Round(time.Second))
		if sp.last.Sub(sp.first) >= persistentDouble {
			c.DoubleBound = append(c.DoubleBound, line)
		} else {
			transient = append(transient, line)
		}
	}
	r.mu.Unlock()
	slices.Sort(c.DoubleBound)
	slices.Sort(transient)
	c.Transient = transient
	for _, d := range e.finalDoubles {
		c.DoubleBound = append(c.DoubleBound, "at the end: "+d)
	}

	var fails []string
	fail := func(format string, a ...any) { fails = append(fails, fmt.Sprintf(format, a...)) }
	fails = append(fails, problems...)
	if c.Creates == 0 {
		fail("no sandbox was created")
	}
	for i, w := range windows {
		if w.Err != "" {
			fail("fault %d (%s, %s) did not recover: %s", i+1, w.Kind, w.Target, w.Err)
		}
	}
	var unexpected []*sandboxRecord
	c.Sandboxes, unexpected = r.outcomes(recs, windows)
	if n := len(unexpected); n > 0 {
		var ex []string
		for _, rec := range unexpected[:min(5, n)] {
			ex = append(ex, fmt.Sprintf("%s (%s): %s %s", rec.Name, rec.Mode, rec.Result, rec.Detail))
		}
		fail("%d sandboxes ended otherwise than planned outside any fault window, e.g. %s", n, strings.Join(ex, "; "))
	}
	c.Calls = soakreport.JudgeCalls(calls, windows, windowSlack)
	if n := len(c.Calls.Outside); n > 0 {
		fail("%d daemon calls failed outside any fault window, the first: %s %s at +%v: %s", n, c.Calls.Outside[0].Sandbox, c.Calls.Outside[0].Op,
			c.Calls.Outside[0].Start.Sub(r.start).Round(time.Second), c.Calls.Outside[0].Err)
	}
	if n := len(c.Calls.Unclear); n > 0 {
		fail("%d daemon calls failed with an error that does not say what failed, the first: %q", n, c.Calls.Unclear[0].Err)
	}
	if n := len(c.Calls.Wrong); n > 0 {
		fail("%d daemon calls answered wrongly, the first: %s: %s", n, c.Calls.Wrong[0].Sandbox, c.Calls.Wrong[0].Err)
	}
	for _, d := range c.DoubleBound {
		fail("bound twice: %s", d)
	}
	for _, s := range e.stuck {
		fail("stuck once the churn stopped: %s", s)
	}
	if e.cleanupErr != nil {
		fail("%v", e.cleanupErr)
	}
	if e.warmErr != nil {
		fail("%v", e.warmErr)
	}
	for _, d := range e.leaks {
		fail("census: %s %d after warm-up, %d at the end%s", d.Name, d.Before, d.After, errNote(d.Err))
	}
	c.RSSRule = soakreport.RSSRule{WarmEnd: r.start.Add(r.cfg.Warmup), GenWarmup: r.cfg.GenWarmup, Window: r.cfg.Window, EndFrom: e.endFrom, Tolerance: 0.10}
	c.RSS = soakreport.CompareRSS(samples, c.RSSRule)
	for _, rc := range c.RSS {
		if rc.Compared && !rc.OK {
			fail("%s: RSS %.1f MiB at the end, %.1f MiB after warm-up (%+.1f %%, more than 10 %%)", rc.Component,
				float64(rc.End)/(1<<20), float64(rc.Baseline)/(1<<20), rc.Growth*100)
		}
	}
	c.Failures = fails

	writeJSON(t, r.artifacts, "churn.json", map[string]any{
		"windows": windows, "calls": calls, "sandboxes": recs, "samples": samples, "problems": problems,
		"census_before": r.censusBefore, "census_after": e.after, "double_bound": c.DoubleBound, "transient": c.Transient, "stuck": e.stuck,
	})
	plot := soakreport.RSSPlot(fmt.Sprintf("RSS during %v of churn under faults (shaded: fault windows)", r.cfg.Duration), samples, r.start, windows)
	publishSoak(t, r.s, r.cfg, r.artifacts, func(rep *soakreport.Report) { rep.Churn = c }, map[string]string{c.Plot: plot.SVG()})
	t.Logf("soak: %d sandboxes, %d daemon calls (%d failed, %d outside fault windows), %d faults; raw data in %s",
		len(recs), c.Calls.Total, c.Calls.Failed, len(c.Calls.Outside), len(windows), r.artifacts)
	for _, f := range fails {
		t.Error(f)
	}
}

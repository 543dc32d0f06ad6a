package soakreport

import (
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
)

// Report is docs/reliability.md: the run's parameters and what each part
// of the soak found. A part that did not run is nil.
type Report struct {
	Generated time.Time
	// Command is how to run the soak again.
	Command string
	Seed    uint64
	Params  []Param
	// Artifacts is where the raw data (JSON) and component logs are.
	Artifacts string
	Churn     *Churn
	Cycles    *Cycles
}

// A Param is one setting of the run.
type Param struct{ Name, Value, Note string }

// Verdicts of a sandbox's end.
const (
	AsPlanned     = "as planned"
	InFaultWindow = "in a fault window"
	Unexpected    = "unexpected"
)

// An Outcome counts sandboxes by how they were meant to end and how they
// did.
type Outcome struct {
	Mode    string // delete, owner, idle, deadline
	Result  string
	Verdict string
	N       int
}

// Churn is the part with trainer-like churn under faults.
type Churn struct {
	// Start of the churn, Stop when creating stopped, Done when the
	// checks were done.
	Start, Stop, Done time.Time
	Faults            []Window
	// Skipped are planned faults that did not fit in the time.
	Skipped   []string
	Sandboxes []Outcome
	// Bursts counts the bursts and the sandboxes they created.
	Bursts, BurstSandboxes int
	Creates, CreateErrors  int
	CreateErrorSamples     []string
	Calls                  CallVerdict
	// DoubleBound are bindings of one pod in two slots that lasted or
	// were there at the end; Transient ones were seen briefly (a bind
	// that completed on an agent after the pool gave up on it, released
	// at once).
	DoubleBound, Transient []string
	Stuck                  []string
	CensusBefore           Census
	CensusAfter            Census
	RSS                    []RSSCheck
	RSSRule                RSSRule
	// Plot is the RSS plot's file name, next to the report.
	Plot     string
	Failures []string
}

// Cycles is the bind/release part on one node agent.
type Cycles struct {
	Agent                     string
	Workers, Planned, Done    int
	Start                     time.Time
	Duration                  time.Duration
	Checkpoints               []Checkpoint
	CensusBefore, CensusAfter Census
	Plot                      string
	Failures                  []string
}

// A Checkpoint is read every 1,000 cycles.
type Checkpoint struct {
	Cycles                  int
	Elapsed                 time.Duration
	AgentRSS, ContainerdRSS int64
	AgentFDs, ContainerdFDs int
}

// Markdown renders the report.
func (r *Report) Markdown() string {
	var b strings.Builder
	p := func(format string, a ...any) { fmt.Fprintf(&b, format, a...) }
	p("# Reliability: the soak\n\n")
	p("Written by `make soak` (`hack/test.sh soak`, which runs `e2e/soak_test.go`) on %s; do not edit by hand, run it again. ",
		r.Generated.UTC().Format("2006-01-02 15:04 MST"))
	p("`SOAK_SEED=%d` repeats this run's decisions (which faults, in which order, the gaps between them, each sandbox's plan and payloads); ", r.Seed)
	p("the timing of a run on a shared machine still differs.\n\n")
	p("## The run\n\n| setting | value | |\n|---|---|---|\n")
	p("| command | `%s` | |\n", r.Command)
	for _, prm := range r.Params {
		p("| %s | %s | %s |\n", cell(prm.Name), cell(prm.Value), cell(prm.Note))
	}
	if r.Artifacts != "" {
		p("\nRaw data (fault log, every daemon call, every sample, each sandbox's history) and the logs of restarted components: `%s`.\n", r.Artifacts)
	}
	p("\n## Churn under faults\n\n")
	if r.Churn == nil {
		p("Not run in this run.\n")
	} else {
		r.Churn.markdown(&b)
	}
	p("\n## Bind/release cycles\n\n")
	if r.Cycles == nil {
		p("Not run in this run (`SOAK_CYCLES=0`, or only the churn was selected).\n")
	} else {
		r.Cycles.markdown(&b)
	}
	return b.String()
}

func verdict(b *strings.Builder, failures []string) {
	if len(failures) == 0 {
		b.WriteString("**Result: passed.**\n\n")
		return
	}
	fmt.Fprintf(b, "**Result: failed** (%d):\n\n", len(failures))
	for _, f := range failures {
		fmt.Fprintf(b, "- %s\n", f)
	}
	b.WriteString("\n")
}

func (c *Churn) markdown(b *strings.Builder) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	verdict(b, c.Failures)
	p("%v of churn from %s: sandboxes created at a steady rate and in bursts, each running commands and file transfers through its daemon, ",
		c.Stop.Sub(c.Start).Round(time.Second), c.Start.UTC().Format(time.DateTime))
	p("then ending as planned: deleted by the trainer, by Kubernetes' garbage collector once their owner pod is deleted, by the idle lease, or by their deadline. ")
	p("Meanwhile one fault at a time, at random gaps. A fault's window runs from the signal until the process serves again and the pool has converged ")
	p("(every node agent healthy in the virtual node, no slot holding a pod that ended or is gone); failures inside it are what the fault may cause.\n\n")

	p("### Fault log\n\n")
	if len(c.Faults) == 0 {
		p("No fault was injected.\n")
	} else {
		p("| # | fault | target | at | down for | recovered after | note |\n|---|---|---|---|---|---|---|\n")
		for i, w := range c.Faults {
			note := w.Detail
			if w.Err != "" {
				note = strings.TrimSpace(note + " **did not recover:** " + w.Err)
			}
			p("| %d | %s | %s | %s | %v | %v | %s |\n", i+1, cell(w.Kind), cell(w.Target), rel(w.Start, c.Start),
				w.Restored.Sub(w.Start).Round(100*time.Millisecond), w.End.Sub(w.Start).Round(100*time.Millisecond), cell(note))
		}
		counts := map[string]int{}
		for _, w := range c.Faults {
			counts[w.Kind]++
		}
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(counts)) {
			parts = append(parts, fmt.Sprintf("%s ×%d", k, counts[k]))
		}
		p("\n%d faults: %s.\n", len(c.Faults), strings.Join(parts, ", "))
	}
	if len(c.Skipped) > 0 {
		p("Planned but not run (no time left before the quiet end): %s.\n", strings.Join(c.Skipped, ", "))
	}

	p("\n### Sandboxes\n\n")
	total := 0
	for _, o := range c.Sandboxes {
		total += o.N
	}
	p("%d sandboxes, %d of them in %d bursts (%d pod creations, %d create calls refused by the API and retried", total, c.BurstSandboxes, c.Bursts, c.Creates, c.CreateErrors)
	if len(c.CreateErrorSamples) > 0 {
		p(", e.g. `%s`", strings.ReplaceAll(c.CreateErrorSamples[0], "`", "'"))
	}
	p(").\n\n| planned end | how it ended | sandboxes | |\n|---|---|---|---|\n")
	for _, o := range c.Sandboxes {
		mark := o.Verdict
		if o.Verdict == Unexpected {
			mark = "**" + o.Verdict + "**"
		}
		p("| %s | %s | %d | %s |\n", cell(o.Mode), cell(o.Result), o.N, mark)
	}

	p("\n### Daemon calls\n\n")
	v := c.Calls
	p("%d daemon calls (exec, file write, file read), %d failed: %d inside fault windows", v.Total, v.Failed, v.Failed-len(v.Outside)-len(v.Wrong))
	if len(v.InWindow) > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(v.InWindow)) {
			parts = append(parts, fmt.Sprintf("%s %d", k, v.InWindow[k]))
		}
		p(" (%s)", strings.Join(parts, ", "))
	}
	p(", %d outside any, %d with an error that does not say what failed, %d answered wrongly.\n", len(v.Outside), len(v.Unclear), len(v.Wrong))
	for _, list := range []struct {
		title string
		calls []Call
	}{{"Outside every fault window", v.Outside}, {"Unclear errors", v.Unclear}, {"Wrong answers", v.Wrong}} {
		if len(list.calls) == 0 {
			continue
		}
		p("\n%s (first 20 of %d):\n\n| at | sandbox | call | error |\n|---|---|---|---|\n", list.title, len(list.calls))
		for _, call := range list.calls[:min(20, len(list.calls))] {
			p("| %s | %s | %s | %s |\n", rel(call.Start, c.Start), cell(call.Sandbox), cell(call.Op), cell(call.Err))
		}
	}

	p("\n### Bindings and pods at the end\n\n")
	if len(c.DoubleBound) == 0 {
		p("No sandbox was bound twice (the agents' inventories were checked every sample and at the end).\n")
	} else {
		p("Bound twice:\n\n")
		for _, d := range c.DoubleBound {
			p("- %s\n", d)
		}
	}
	if len(c.Transient) > 0 {
		p("\nSeen briefly (shown, not failed):\n\n")
		for _, d := range c.Transient {
			p("- %s\n", d)
		}
		p("\n")
	}
	if len(c.Stuck) == 0 {
		p("With the churn stopped, no pod was stuck: each was Ready, had ended with a reason, or was gone.\n")
	} else {
		p("\nStuck pods once the churn stopped:\n\n")
		for _, s := range c.Stuck {
			p("- %s\n", s)
		}
	}

	p("\n### Census\n\nTaken after the warm-up (every slot made, warm, nothing bound) and after the churn (all sandboxes gone, polled until equal or a deadline).\n\n")
	censusTable(b, c.CensusBefore, c.CensusAfter)

	p("\n### Memory and file descriptors\n\n")
	if c.Plot != "" {
		p("![RSS of each component over the soak; shaded: fault windows](%s)\n\n", c.Plot)
	}
	p("RSS (VmRSS) and open file descriptors, sampled from `/proc`. The baseline is the median over %v from the end of the warm-up ",
		c.RSSRule.Window)
	p("(for a restarted process: %v after its restart, against its own samples); the end value is the median once the churn stopped and the census settled. ",
		c.RSSRule.GenWarmup)
	p("A component fails when its end value is more than %.0f %% above its baseline; a drop does not fail. ", c.RSSRule.Tolerance*100)
	p("The anonymous part (RssAnon) and file descriptors are shown, not judged: file-backed pages, such as etcd's mmapped database, count in RSS too.\n\n")
	p("| component | restarts | baseline | end | change | anonymous (baseline → end) | fds (baseline → end) | |\n|---|---|---|---|---|---|---|---|\n")
	for _, r := range c.RSS {
		mark, change := "ok", fmt.Sprintf("%+.1f %%", r.Growth*100)
		switch {
		case !r.Compared:
			mark, change = r.Note, "–"
		case !r.OK:
			mark = "**over**"
		}
		p("| %s | %d | %s | %s | %s | %s → %s | %d → %d | %s |\n", cell(r.Component), r.Restarts, mib(r.Baseline), mib(r.End), change,
			mib(r.BaselineAnon), mib(r.EndAnon), r.BaselineFDs, r.EndFDs, cell(mark))
	}
}

func (c *Cycles) markdown(b *strings.Builder) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	verdict(b, c.Failures)
	rate := 0.0
	if c.Duration > 0 {
		rate = float64(c.Done) / c.Duration.Seconds()
	}
	p("%d of %d bind/release cycles on node agent `%s` through its node API, %d at a time, in %v (%.1f cycles/s): the leak test's method, longer. ",
		c.Done, c.Planned, c.Agent, c.Workers, c.Duration.Round(time.Second), rate)
	p("The census is taken with every slot warm before the first cycle and after the last.\n\n")
	if c.Plot != "" {
		p("![RSS of the node agent and containerd over the cycles](%s)\n\n", c.Plot)
	}
	p("| cycles | elapsed | agent RSS | agent fds | containerd RSS | containerd fds |\n|---|---|---|---|---|---|\n")
	for _, cp := range c.Checkpoints {
		p("| %d | %v | %s | %d | %s | %d |\n", cp.Cycles, cp.Elapsed.Round(time.Second), mib(cp.AgentRSS), cp.AgentFDs, mib(cp.ContainerdRSS), cp.ContainerdFDs)
	}
	if n := len(c.Checkpoints); n > 2 {
		// From the first thousand (caches and pools filled) to the end.
		first, last := c.Checkpoints[1], c.Checkpoints[n-1]
		p("\nFrom %d to %d cycles: agent RSS %s, %+d fds; containerd RSS %s, %+d fds. These are reported, not judged.\n",
			first.Cycles, last.Cycles, growth(first.AgentRSS, last.AgentRSS), last.AgentFDs-first.AgentFDs,
			growth(first.ContainerdRSS, last.ContainerdRSS), last.ContainerdFDs-first.ContainerdFDs)
	}
	p("\n")
	censusTable(b, c.CensusBefore, c.CensusAfter)
}

func growth(from, to int64) string {
	if from == 0 {
		return "–"
	}
	return fmt.Sprintf("%+.1f %%", (float64(to)/float64(from)-1)*100)
}

// censusTable shows every entry before and after; differing members are
// listed below the table.
func censusTable(b *strings.Builder, before, after Census) {
	p := func(format string, a ...any) { fmt.Fprintf(b, format, a...) }
	switch {
	case len(before) == 0 && len(after) == 0:
		p("No census was taken.\n")
		return
	case len(after) == 0:
		p("No census was taken at the end (the run stopped early); before:\n\n| what | before |\n|---|---|\n")
		for _, e := range before {
			p("| %s | %s |\n", cell(e.Name), count(e, true))
		}
		return
	}
	deltas := Diff(before, after)
	byName := map[string]Delta{}
	for _, d := range deltas {
		byName[d.Name] = d
	}
	var names []string
	seen := map[string]bool{}
	for _, c := range []Census{before, after} {
		for _, e := range c {
			if !seen[e.Name] {
				seen[e.Name] = true
				names = append(names, e.Name)
			}
		}
	}
	p("| what | before | after | |\n|---|---|---|---|\n")
	for _, name := range names {
		bv, bok := before.Get(name)
		av, aok := after.Get(name)
		d, differs := byName[name]
		mark := "="
		switch {
		case differs && d.Err != "":
			mark = "**not counted:** " + d.Err
		case differs && d.Counted() && d.Info:
			mark = "differs (host-wide, shown only)"
		case differs && d.Counted():
			mark = "**differs**"
		case differs:
			mark = "= (members replaced)"
		case bv.Info || av.Info:
			mark = "= (host-wide, shown only)"
		}
		p("| %s | %s | %s | %s |\n", cell(name), count(bv, bok), count(av, aok), cell(mark))
	}
	for _, d := range deltas {
		if len(d.Added)+len(d.Removed) == 0 || (!d.Counted() && len(d.Added) > 5) {
			continue
		}
		p("\n%s:", d.Name)
		if len(d.Added) > 0 {
			p(" new %s;", strings.Join(clip(d.Added, 10), ", "))
		}
		if len(d.Removed) > 0 {
			p(" gone %s;", strings.Join(clip(d.Removed, 10), ", "))
		}
		p("\n")
	}
}

func count(e Entry, ok bool) string {
	switch {
	case !ok:
		return "–"
	case e.Err != "":
		return "?"
	}
	return fmt.Sprint(e.N)
}

func clip(s []string, n int) []string {
	if len(s) <= n {
		return s
	}
	return append(slices.Clone(s[:n]), fmt.Sprintf("… %d more", len(s)-n))
}

// cell makes s safe in a markdown table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}

// rel is t as +m:ss (or +h:mm:ss) after start.
func rel(t, start time.Time) string {
	d := t.Sub(start).Round(time.Second)
	sign := "+"
	if d < 0 {
		sign, d = "-", -d
	}
	h, m, s := int(d.Hours()), int(d.Minutes())%60, int(d.Seconds())%60
	if h > 0 {
		return fmt.Sprintf("%s%d:%02d:%02d", sign, h, m, s)
	}
	return fmt.Sprintf("%s%d:%02d", sign, m, s)
}

func mib(b int64) string {
	if b == 0 {
		return "–"
	}
	return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
}

// RSSPlot draws each component's RSS in MiB over minutes since start, one
// line per process (a restart starts a new line), fault windows shaded.
func RSSPlot(title string, samples []Sample, start time.Time, ws []Window) Plot {
	byComp := map[string][]Sample{}
	for _, s := range samples {
		byComp[s.Component] = append(byComp[s.Component], s)
	}
	p := Plot{Title: title, XLabel: "minutes since the churn started", YLabel: "RSS (MiB)", YFromZero: true}
	for _, name := range slices.Sorted(maps.Keys(byComp)) {
		ss := byComp[name]
		slices.SortStableFunc(ss, func(a, b Sample) int { return a.T.Compare(b.T) })
		s := Series{Name: name}
		for i, smp := range ss {
			s.Points = append(s.Points, Point{X: smp.T.Sub(start).Minutes(), Y: float64(smp.RSS) / (1 << 20), Break: i > 0 && smp.Gen != ss[i-1].Gen})
		}
		p.Series = append(p.Series, s)
	}
	for _, w := range ws {
		p.Bands = append(p.Bands, Band{From: w.Start.Sub(start).Minutes(), To: w.End.Sub(start).Minutes(), Label: w.Kind})
	}
	return p
}

// CyclesPlot draws the agent's and containerd's RSS in MiB over cycles.
func CyclesPlot(title string, cps []Checkpoint) Plot {
	agent, ctrd := Series{Name: "sandman-node"}, Series{Name: "containerd"}
	for _, cp := range cps {
		agent.Points = append(agent.Points, Point{X: float64(cp.Cycles), Y: float64(cp.AgentRSS) / (1 << 20)})
		ctrd.Points = append(ctrd.Points, Point{X: float64(cp.Cycles), Y: float64(cp.ContainerdRSS) / (1 << 20)})
	}
	return Plot{Title: title, XLabel: "bind/release cycles", YLabel: "RSS (MiB)", YFromZero: true, Series: []Series{agent, ctrd}}
}

// Command bench runs sandman's benchmarks, each beside a baseline measured in
// the same run (this machine is shared and noisy), and prints one table:
// median and p99, and the ratio to the baseline. `make bench` runs it; the
// figures go in docs/benchmarks.md with the command that produced them.
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"
)

// row is one line of the table.
type row struct {
	name     string
	n        int
	p50, p99 string
	baseline string // what the ratio compares against
	ratio    string
	note     string
}

type suite struct {
	name string
	run  func(cfg config) ([]row, error)
}

type config struct {
	root string
	n    int
}

var suites = []suite{
	{"daemon", benchDaemon},
	{"node", benchNode},
	{"vk", benchVK},
	{"image", benchImage},
	{"e2b", benchE2B},
	// failover kills sandman-vk leaders (about a minute a run): only when
	// asked for (BENCH_SUITE=failover).
	{"failover", benchFailover},
	// hot runs issue 16's mixed burst once per hot budget (about 10
	// minutes): only when asked for (BENCH_SUITE=hot).
	{"hot", benchHot},
	// deploy installs deploy/overlays/local: only when asked for (BENCH_SUITE=deploy).
	{"deploy", benchDeploy},
	// snapshot (prepared environments, issue 18) takes about two minutes:
	// only when asked for (BENCH_SUITE=snapshot).
	{"snapshot", benchSnapshot},
	// scale takes many minutes: only when asked for (BENCH_SUITE=scale).
	{"scale", benchScale},
}

func main() {
	var (
		only = flag.String("suite", "all", "comma-separated suites to run: "+suiteNames()+" or all (all but failover, hot, deploy and scale)")
		n    = flag.Int("n", 500, "iterations for latency benchmarks")
		out  = flag.String("out", "", "also write the table (markdown) to this file")
	)
	flag.Parse()
	root, err := os.Getwd()
	if err != nil {
		fatal(err)
	}
	var rows []row
	for _, s := range suites {
		if *only == "all" && (s.name == "scale" || s.name == "deploy" || s.name == "failover" || s.name == "snapshot" || s.name == "hot") {
			continue
		}
		if *only != "all" && !slices.Contains(strings.Split(*only, ","), s.name) {
			continue
		}
		fmt.Fprintf(os.Stderr, "== suite %s\n", s.name)
		r, err := s.run(config{root: root, n: *n})
		if err != nil {
			fatal(fmt.Errorf("suite %s: %w", s.name, err))
		}
		rows = append(rows, r...)
	}
	table := render(rows)
	fmt.Print(table)
	if *out != "" {
		host, _ := os.Hostname()
		hdr := fmt.Sprintf("<!-- %s on %s, %s -->\n", strings.Join(os.Args, " "), host, time.Now().UTC().Format(time.RFC3339))
		if err := os.WriteFile(*out, []byte(hdr+table), 0o644); err != nil {
			fatal(err)
		}
	}
}

func suiteNames() string {
	var names []string
	for _, s := range suites {
		names = append(names, s.name)
	}
	return strings.Join(names, ",")
}

func render(rows []row) string {
	var b strings.Builder
	b.WriteString("| benchmark | n | p50 | p99 | baseline (same run) | ratio | note |\n|---|---|---|---|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %d | %s | %s | %s | %s | %s |\n", r.name, r.n, r.p50, r.p99, r.baseline, r.ratio, r.note)
	}
	return b.String()
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "bench: %v\n", err)
	os.Exit(1)
}

// durations summarises latency samples.
type durations []time.Duration

func (d durations) pct(p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	i := int(p * float64(len(s)-1))
	return s[i]
}

func (d durations) p50() time.Duration { return d.pct(0.5) }
func (d durations) p99() time.Duration { return d.pct(0.99) }

func ms(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/float64(time.Millisecond)) }

func ratio(a, b time.Duration) string {
	if b == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f×", float64(a)/float64(b))
}

// timeN runs f n times (after a short warm-up) and returns the samples.
func timeN(n int, f func() error) (durations, error) {
	for range min(n/10+1, 20) {
		if err := f(); err != nil {
			return nil, err
		}
	}
	out := make(durations, 0, n)
	for range n {
		start := time.Now()
		if err := f(); err != nil {
			return nil, err
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}

// timeInterleaved times a and b n times each, one of each in turn (after a
// short warm-up of both), so that a machine whose speed drifts within a run
// (a shared VM's fork+exec moved between 2.4 and 3.4 ms minutes apart)
// slows the measured operation and its baseline alike.
func timeInterleaved(n int, a, b func() error) (durations, durations, error) {
	for range min(n/10+1, 20) {
		if err := a(); err != nil {
			return nil, nil, err
		}
		if err := b(); err != nil {
			return nil, nil, err
		}
	}
	da, db := make(durations, 0, n), make(durations, 0, n)
	for range n {
		start := time.Now()
		if err := a(); err != nil {
			return nil, nil, err
		}
		mid := time.Now()
		if err := b(); err != nil {
			return nil, nil, err
		}
		da, db = append(da, mid.Sub(start)), append(db, time.Since(mid))
	}
	return da, db, nil
}

// sampleN runs f n times (after a short warm-up) and keeps the durations f
// reports, for benchmarks that time only part of each iteration.
func sampleN(n int, f func() (time.Duration, error)) (durations, error) {
	for range min(n/10+1, 5) {
		if _, err := f(); err != nil {
			return nil, err
		}
	}
	out := make(durations, 0, n)
	for range n {
		d, err := f()
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

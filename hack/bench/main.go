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

// A suite is one family of benchmarks. inAll says whether -suite all, make
// bench's default, runs it; the others take many minutes or change the
// stack, and run only when named.
type suite struct {
	name  string
	inAll bool
	about string // one line for -help
	run   func(cfg config) ([]row, error)
}

type config struct {
	root string
	n    int
}

// suites is every suite, in the order they run. The Makefile's bench help
// and hack/bench.sh list them too (TestHelpListsEverySuite).
var suites = []suite{
	{"daemon", true, "the daemon's HTTP API over loopback, as it ships", benchDaemon},
	{"node", true, "binds on the real containerd runtime beside raw containerd", benchNode},
	{"vk", true, "create → Ready through the virtual node and a node agent", benchVK},
	{"image", true, "cold pulls through nodeimage beside containerd's, pre-pulled binds", benchImage},
	{"e2b", true, "the E2B SDK through sandman-gateway beside sandman's own path", benchE2B},
	{"hostile", false, "one tenant's hostile builds, log reads and uploads beside another's creates through one gateway, about 3 minutes", benchHostile},
	{"failover", false, "sandman-vk leaders killed, about a minute a run", benchFailover},
	{"hot", false, "the mixed burst once per hot budget, about 10 minutes (BENCH_HOT_*)", benchHot},
	{"deploy", false, "installs deploy/overlays/local: the deployed path beside host processes", benchDeploy},
	{"snapshot", false, "prepared environments: snapshot, fork and bind, about 2.5 minutes", benchSnapshot},
	{"pause", false, "pause and resume of gVisor sandboxes holding 64 MiB to 1 GiB, a few minutes", benchPause},
	{"move", false, "moves of gVisor sandboxes between two nodes through the registry, and the memory pausing frees, a few minutes", benchMove},
	{"lazy", false, "lazy pulling (stargz) against full pulls: a cold 2 GiB image, warm binds, git and pytest, a Zipf trace of 200 binds, about 15 minutes (BENCH_LAZY_*)", benchLazy},
	{"scale", false, "20,000 sandboxes, bursts and scheduler load, many minutes (BENCH_SCALE_*)", benchScale},
}

func main() {
	var (
		only = flag.String("suite", "all", "comma-separated suites to run (below), or all: "+strings.Join(suiteNames(true), ","))
		n    = flag.Int("n", 500, "iterations for latency benchmarks")
		out  = flag.String("out", "", "also write the table (markdown) to this file")
	)
	flag.Usage = usage
	flag.Parse()
	picked, err := pick(*only)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		usage()
		os.Exit(2)
	}
	root, err := os.Getwd()
	if err != nil {
		fatal(err)
	}
	var rows []row
	for _, s := range picked {
		fmt.Fprintf(os.Stderr, "== suite %s\n", s.name)
		r, err := s.run(config{root: root, n: *n})
		if err != nil {
			// What the suite measured before it failed is still said.
			fmt.Print(render(append(rows, r...)))
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

func usage() {
	w := flag.CommandLine.Output()
	fmt.Fprintf(w, "usage: go run ./hack/bench [-suite NAMES] [-n N] [-out FILE] (make bench: BENCH_SUITE, BENCH_N, BENCH_OUT)\n")
	flag.PrintDefaults()
	fmt.Fprintf(w, "suites (* in all):\n")
	for _, s := range suites {
		mark := " "
		if s.inAll {
			mark = "*"
		}
		fmt.Fprintf(w, "  %s %-9s %s\n", mark, s.name, s.about)
	}
}

// suiteNames is the names of the suites all runs (inAll) or does not.
func suiteNames(inAll bool) []string {
	var names []string
	for _, s := range suites {
		if s.inAll == inAll {
			names = append(names, s.name)
		}
	}
	return names
}

// pick is the suites only names (comma-separated; all is every suite with
// inAll), in the order of suites. A name that is no suite is an error.
func pick(only string) ([]suite, error) {
	names := strings.Split(only, ",")
	for _, name := range names {
		if name != "all" && !slices.ContainsFunc(suites, func(s suite) bool { return s.name == name }) {
			return nil, fmt.Errorf("no suite %q: the suites are %s, or all", name, strings.Join(append(suiteNames(true), suiteNames(false)...), ","))
		}
	}
	var picked []suite
	for _, s := range suites {
		if (s.inAll && slices.Contains(names, "all")) || slices.Contains(names, s.name) {
			picked = append(picked, s)
		}
	}
	return picked, nil
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

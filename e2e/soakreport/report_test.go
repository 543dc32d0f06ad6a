package soakreport

import (
	"strings"
	"testing"
	"time"
)

func TestMarkdown(t *testing.T) {
	r := &Report{
		Generated: at(0), Command: "make soak", Seed: 42,
		Params: []Param{{Name: "SOAK_DURATION", Value: "30m"}},
		Churn: &Churn{
			Start: at(0), Stop: at(1800), Done: at(2000),
			Faults: []Window{{Kind: "kill etcd", Target: "etcd (pid 10 → 11)", Start: at(300), Restored: at(310), End: at(330)},
				{Kind: "stop node agent", Target: "w0", Start: at(600), Restored: at(740), End: at(800), Err: "w0 unhealthy"}},
			Sandboxes:    []Outcome{{Mode: "delete", Result: "deleted", Verdict: AsPlanned, N: 10}, {Mode: "idle", Result: "Failed NodeLost", Verdict: Unexpected, N: 1}},
			Calls:        JudgeCalls([]Call{{Start: at(900), End: at(901), Sandbox: "soak-1", Op: "exec", Err: "a | b"}}, nil, 0),
			CensusBefore: Census{{Name: "containers", N: 0}, {Name: "mounts (host)", N: 10, Info: true}},
			CensusAfter:  Census{{Name: "containers", N: 2, Items: []string{"x", "y"}}, {Name: "mounts (host)", N: 11, Info: true}},
			RSS:          []RSSCheck{{Component: "etcd", Compared: true, OK: false, Baseline: 100 << 20, End: 130 << 20, Growth: 0.3}},
			RSSRule:      RSSRule{Window: time.Minute, GenWarmup: time.Minute, Tolerance: 0.1},
			Plot:         "reliability-rss.svg",
			Failures:     []string{"1 daemon call failed outside any fault window"},
		},
	}
	md := r.Markdown()
	for _, want := range []string{
		"SOAK_SEED=42",
		"**Result: failed** (1)",
		"| 1 | kill etcd | etcd (pid 10 → 11) | +5:00 | 10s | 30s |",
		"**did not recover:** w0 unhealthy",
		"kill etcd ×1, stop node agent ×1",
		"| idle | Failed NodeLost | 1 | **unexpected** |",
		`| +15:00 | soak-1 | exec | a \| b |`,
		"| containers | 0 | 2 | **differs** |",
		"| mounts (host) | 10 | 11 | differs (host-wide, shown only) |",
		"containers: new x, y;",
		"| etcd | 0 | 100.0 MiB | 130.0 MiB | +30.0 % | – → – | 0 → 0 | **over** |",
		"![RSS of each component",
		"## Bind/release cycles\n\nNot run in this run",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
	r.Churn = nil
	r.Cycles = &Cycles{Agent: "w0", Workers: 4, Planned: 2000, Done: 2000, Duration: 100 * time.Second,
		Checkpoints: []Checkpoint{{}, {Cycles: 1000, Elapsed: 50 * time.Second, AgentRSS: 30 << 20, AgentFDs: 12, ContainerdRSS: 60 << 20, ContainerdFDs: 80}}}
	r.Cycles.Checkpoints = append(r.Cycles.Checkpoints, Checkpoint{Cycles: 2000, AgentRSS: 33 << 20, AgentFDs: 14, ContainerdRSS: 60 << 20, ContainerdFDs: 80})
	md = r.Markdown()
	for _, want := range []string{"## Churn under faults\n\nNot run in this run.", "**Result: passed.**", "(20.0 cycles/s)", "| 1000 | 50s | 30.0 MiB | 12 | 60.0 MiB | 80 |", "No census was taken.",
		"From 1000 to 2000 cycles: agent RSS +10.0 %, +2 fds; containerd RSS +0.0 %, +0 fds."} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}

func TestMarkdownStoppedEarly(t *testing.T) {
	r := &Report{Churn: &Churn{Start: at(0), Stop: at(60),
		CensusBefore: Census{{Name: "w0: containerd containers", N: 0}},
		Failures:     []string{"the soak stopped before its end: see the test's failure"}}}
	md := r.Markdown()
	for _, want := range []string{"No census was taken at the end (the run stopped early)", "| w0: containerd containers | 0 |", "- the soak stopped before its end"} {
		if !strings.Contains(md, want) {
			t.Errorf("report lacks %q:\n%s", want, md)
		}
	}
}

func TestRel(t *testing.T) {
	for d, want := range map[time.Duration]string{0: "+0:00", 61 * time.Second: "+1:01", 3725 * time.Second: "+1:02:05", -5 * time.Second: "-0:05"} {
		if got := rel(t0.Add(d), t0); got != want {
			t.Errorf("rel(%v) = %q, want %q", d, got, want)
		}
	}
}

package soakreport

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)

func at(sec float64) time.Time { return t0.Add(time.Duration(sec * float64(time.Second))) }

func TestJudgeCalls(t *testing.T) {
	ws := []Window{
		{Kind: "kill node agent", Start: at(100), Restored: at(103), End: at(120)},
		{Kind: "kill etcd", Start: at(300), Restored: at(310), End: at(340)},
	}
	calls := []Call{
		{Start: at(10), End: at(11), Sandbox: "a", Op: "exec"},                                                                 // ok
		{Start: at(99), End: at(101), Sandbox: "b", Op: "exec", Err: "dial tcp 10.213.0.5:49983: connect: connection refused"}, // overlaps the start
		{Start: at(121), End: at(122), Sandbox: "c", Op: "read", Err: "sandbox daemon: gone (404 not_found)"},                  // within the slack
		{Start: at(130), End: at(131), Sandbox: "d", Op: "write", Err: "connection reset by peer"},                             // outside
		{Start: at(305), End: at(305), Sandbox: "e", Op: "exec", Err: "EOF"},                                                   // inside, unclear
		{Start: at(400), End: at(401), Sandbox: "f", Op: "exec", Wrong: true, Err: `hostname "g", want "f"`},                   // wrong: never excused
		{Start: at(401), End: at(402), Sandbox: "g", Op: "exec", Err: "context deadline exceeded"},                             // outside and unclear
	}
	v := JudgeCalls(calls, ws, 2*time.Second)
	if v.Total != 7 || v.Failed != 6 {
		t.Fatalf("total %d failed %d, want 7 and 6", v.Total, v.Failed)
	}
	names := func(cs []Call) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.Sandbox)
		}
		return out
	}
	if got := names(v.Outside); !slices.Equal(got, []string{"d", "g"}) {
		t.Errorf("outside: %v", got)
	}
	if got := names(v.Unclear); !slices.Equal(got, []string{"e", "g"}) {
		t.Errorf("unclear: %v", got)
	}
	if got := names(v.Wrong); !slices.Equal(got, []string{"f"}) {
		t.Errorf("wrong: %v", got)
	}
	if v.InWindow["kill node agent"] != 2 || v.InWindow["kill etcd"] != 1 {
		t.Errorf("in windows: %v", v.InWindow)
	}
	if v.OK() {
		t.Error("a verdict with failures outside windows is OK")
	}
	if !JudgeCalls(calls[:3], ws, 2*time.Second).OK() {
		t.Error("failures inside windows with clear errors are not OK")
	}
}

func TestWindowCovers(t *testing.T) {
	w := Window{Start: at(10), End: at(20)}
	for _, tc := range []struct {
		name     string
		from, to float64
		slack    time.Duration
		want     bool
	}{
		{"before", 1, 9, 0, false},
		{"ends at the start", 5, 10, 0, true},
		{"inside", 12, 13, 0, true},
		{"spans it", 5, 25, 0, true},
		{"after", 21, 22, 0, false},
		{"after, within slack", 21, 22, 2 * time.Second, true},
		{"after the slack", 23, 24, 2 * time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := w.Covers(at(tc.from), at(tc.to), tc.slack); got != tc.want {
				t.Errorf("Covers(%v, %v) = %v, want %v", tc.from, tc.to, got, tc.want)
			}
		})
	}
}

func TestClearError(t *testing.T) {
	for msg, want := range map[string]bool{
		"":                                false,
		"  ":                              false,
		"EOF":                             false,
		"unexpected EOF":                  false,
		"context deadline exceeded":       false,
		"sandbox daemon:  (502 http_502)": false,
		"sandbox daemon: not found (404 not_found)":                                                      true,
		`Post "http://10.213.0.7:49983/v1/exec": dial tcp 10.213.0.7:49983: connect: connection refused`: true,
		`Get "http://10.213.0.7:49983/v1/files?path=%2Ftmp%2Fx": EOF`:                                    true,
	} {
		if got := ClearError(msg); got != want {
			t.Errorf("ClearError(%q) = %v, want %v", msg, got, want)
		}
	}
}

func TestPlanFaults(t *testing.T) {
	kinds := []string{"vk", "agent", "containerd", "apiserver", "etcd", "stop"}
	for seed := range uint64(200) {
		plan := PlanFaults(rand.New(rand.NewPCG(seed, 1)), kinds, 3)
		if len(plan) != 18 {
			t.Fatalf("seed %d: %d faults, want 18", seed, len(plan))
		}
		counts := map[string]int{}
		for i, k := range plan {
			counts[k]++
			if i > 0 && plan[i-1] == k {
				t.Fatalf("seed %d: %s twice in a row: %v", seed, k, plan)
			}
		}
		for _, k := range kinds {
			if counts[k] != 3 {
				t.Fatalf("seed %d: %s %d times, want 3: %v", seed, k, counts[k], plan)
			}
		}
	}
	a := PlanFaults(rand.New(rand.NewPCG(7, 1)), kinds, 3)
	b := PlanFaults(rand.New(rand.NewPCG(7, 1)), kinds, 3)
	if !slices.Equal(a, b) {
		t.Errorf("one seed, two plans: %v %v", a, b)
	}
	// Unequal counts (y×4, x×2, z×2): still no repeat, since they allow it.
	for seed := range uint64(50) {
		plan := PlanFaults(rand.New(rand.NewPCG(seed, 1)), []string{"x", "y", "y", "z"}, 2)
		if got := slices.Compact(slices.Clone(plan)); len(got) != len(plan) {
			t.Errorf("seed %d: a repeat that could be avoided: %v", seed, plan)
		}
	}
	// One kind can only repeat.
	if plan := PlanFaults(rand.New(rand.NewPCG(1, 1)), []string{"only"}, 3); !slices.Equal(plan, []string{"only", "only", "only"}) {
		t.Errorf("one kind: %v", plan)
	}
}

func TestNextGap(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 100 {
		g := NextGap(r, 10*time.Minute, 4*time.Minute, 5, 10*time.Second)
		// share = 6 min / 6 = 1 min; drawn from 30 s to 90 s.
		if g < 30*time.Second || g > 90*time.Second {
			t.Fatalf("gap %v outside [30s, 90s]", g)
		}
	}
	if g := NextGap(r, time.Minute, 5*time.Minute, 3, 10*time.Second); g != 10*time.Second {
		t.Errorf("no time left: gap %v, want the minimum", g)
	}
}

package noderuntime

import (
	"maps"
	"strings"
	"testing"
	"time"
)

// TestHotTargets: the hot pool per image from the decayed bind counts.
func TestHotTargets(t *testing.T) {
	for _, tc := range []struct {
		name   string
		budget int
		pinned []string
		demand map[string]float64
		want   map[string]int
	}{
		{
			name: "off", budget: 0, pinned: []string{"p"}, demand: map[string]float64{"a": 10},
			want: map[string]int{},
		},
		{
			// 50/25/12/8/5 % of 100 binds: every image keeps one, the rest
			// goes by share.
			name: "skewed mix", budget: 12,
			demand: map[string]float64{"a": 50, "b": 25, "c": 12, "d": 8, "e": 5},
			want:   map[string]int{"a": 6, "b": 3, "c": 1, "d": 1, "e": 1},
		},
		{
			name: "skewed mix, bigger budget", budget: 20,
			demand: map[string]float64{"a": 50, "b": 25, "c": 12, "d": 8, "e": 5},
			want:   map[string]int{"a": 10, "b": 5, "c": 2, "d": 2, "e": 1},
		},
		{
			// Fewer slots than images: the most demanded get one each.
			name: "budget below the images", budget: 3,
			demand: map[string]float64{"a": 50, "b": 25, "c": 12, "d": 8, "e": 5},
			want:   map[string]int{"a": 1, "b": 1, "c": 1},
		},
		{
			// An image gets no more than its recent binds: the rest of
			// the budget stays cold.
			name: "demand caps the pool", budget: 10,
			demand: map[string]float64{"a": 2.2, "b": 0.9},
			want:   map[string]int{"a": 3, "b": 1},
		},
		{
			name: "an image that left the mix gets nothing", budget: 4,
			demand: map[string]float64{"a": 8, "gone": 0.4},
			want:   map[string]int{"a": 4},
		},
		{
			name: "pinned kept whatever the mix", budget: 4, pinned: []string{"p"},
			demand: map[string]float64{"a": 40},
			want:   map[string]int{"p": 1, "a": 3},
		},
		{
			name: "pinned share what the mix leaves", budget: 6, pinned: []string{"p", "q"},
			demand: map[string]float64{"a": 1},
			want:   map[string]int{"p": 3, "q": 2, "a": 1},
		},
		{
			name: "no mix: the pinned share the budget", budget: 5, pinned: []string{"p", "q", "p"},
			want: map[string]int{"p": 3, "q": 2},
		},
		{
			name: "pinned beyond the budget", budget: 1, pinned: []string{"p", "q"},
			demand: map[string]float64{"a": 40},
			want:   map[string]int{"p": 1},
		},
		{
			name: "a pinned image in demand", budget: 6, pinned: []string{"a"},
			demand: map[string]float64{"a": 30, "b": 14},
			want:   map[string]int{"a": 4, "b": 2},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := hotTargets(tc.budget, tc.pinned, tc.demand)
			if !maps.Equal(got, tc.want) {
				t.Errorf("hotTargets(%d, %v, %v) = %v, want %v", tc.budget, tc.pinned, tc.demand, got, tc.want)
			}
			sum := 0
			for _, n := range got {
				sum += n
			}
			if sum > tc.budget {
				t.Errorf("targets %v sum to %d, over the budget %d", got, sum, tc.budget)
			}
		})
	}
}

// TestHotMixDecay: an image no longer bound shrinks to no hot sandbox, by
// time on a quiet node and by count on a busy one.
func TestHotMixDecay(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	const half = time.Minute
	t.Run("by time", func(t *testing.T) {
		m := hotMix{window: 100, halfLife: half}
		for range 8 {
			m.add("a", t0)
		}
		m.add("b", t0)
		var got []int
		for k := range 6 {
			got = append(got, hotTargets(8, nil, m.demand(t0.Add(time.Duration(k)*half)))["a"])
		}
		// 8 binds: 7, 4, 2, 1, 1 (0.5), then gone.
		want := []int{7, 4, 2, 1, 1, 0}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("a's target each half-life: %v, want %v", got, want)
			}
		}
		if len(m.binds) != 9 {
			t.Fatalf("%d binds kept, want 9 (weights not yet below 1/64)", len(m.binds))
		}
		m.demand(t0.Add(7 * half))
		if len(m.binds) != 0 {
			t.Fatalf("%d binds kept after 7 half-lives, want none", len(m.binds))
		}
	})
	t.Run("by count", func(t *testing.T) {
		m := hotMix{window: 10, halfLife: half}
		for range 10 {
			m.add("a", t0)
		}
		before := hotTargets(4, nil, m.demand(t0))
		for range 10 {
			m.add("b", t0)
		}
		after := hotTargets(4, nil, m.demand(t0))
		if !maps.Equal(before, map[string]int{"a": 4}) || !maps.Equal(after, map[string]int{"b": 4}) {
			t.Fatalf("targets %v, then %v after 10 binds of b; want a: 4, then b: 4", before, after)
		}
	})
	t.Run("the mix moves", func(t *testing.T) {
		// 80 % a then 80 % b: the targets follow within the window.
		m := hotMix{window: 50, halfLife: half}
		at := t0
		bind := func(major, minor string, n int) map[string]int {
			for i := range n {
				at = at.Add(100 * time.Millisecond)
				img := major
				if i%5 == 4 {
					img = minor
				}
				m.add(img, at)
			}
			return hotTargets(10, nil, m.demand(at))
		}
		if got := bind("a", "b", 50); got["a"] != 8 || got["b"] != 2 {
			t.Fatalf("after 80 %% a: %v", got)
		}
		if got := bind("b", "a", 50); got["a"] != 2 || got["b"] != 8 {
			t.Fatalf("after 80 %% b: %v", got)
		}
	})
}

// TestHotSurplus: what to cool down, with a dead band of one above a
// non-zero target so a target that wavers by one moves nothing.
func TestHotSurplus(t *testing.T) {
	for _, tc := range []struct {
		targets, have, want map[string]int
	}{
		{targets: map[string]int{"a": 3}, have: map[string]int{"a": 3}, want: map[string]int{}},
		{targets: map[string]int{"a": 3}, have: map[string]int{"a": 4}, want: map[string]int{}},
		{targets: map[string]int{"a": 3}, have: map[string]int{"a": 6}, want: map[string]int{"a": 2}},
		{targets: map[string]int{"a": 3}, have: map[string]int{"a": 1}, want: map[string]int{}},
		{targets: map[string]int{"a": 1}, have: map[string]int{"gone": 2, "a": 1}, want: map[string]int{"gone": 2}},
		{targets: map[string]int{}, have: map[string]int{"gone": 0}, want: map[string]int{}},
	} {
		got := hotSurplus(tc.targets, tc.have)
		if !maps.Equal(got, tc.want) {
			t.Errorf("hotSurplus(%v, %v) = %v, want %v", tc.targets, tc.have, got, tc.want)
		}
	}
	// Hysteresis over time: the target wavering between 3 and 4 never
	// cools what was started for 4.
	have := map[string]int{"a": 4}
	for i, target := range []int{4, 3, 4, 3, 3, 4} {
		if s := hotSurplus(map[string]int{"a": target}, have); s["a"] != 0 {
			t.Fatalf("round %d (target %d): cools %d", i, target, s["a"])
		}
	}
}

func TestHotCoolAfter(t *testing.T) {
	for _, tc := range []struct{ half, want time.Duration }{
		{5 * time.Minute, 30 * time.Second},
		{time.Hour, 30 * time.Second},
		{2 * time.Second, 200 * time.Millisecond},
	} {
		if got := hotCoolAfter(tc.half); got != tc.want {
			t.Errorf("hotCoolAfter(%v) = %v, want %v", tc.half, got, tc.want)
		}
	}
	if !strings.HasPrefix(hotSuffix, "-") {
		t.Fatal("hot container IDs must not collide with a pod container's (slot-NAME)")
	}
}

// TestHotBackoff: a failing image's hot starts back off from 1 s, doubling,
// to at most 5 minutes.
func TestHotBackoff(t *testing.T) {
	var d time.Duration
	var got []time.Duration
	for range 11 {
		d = nextHotBackoff(d)
		got = append(got, d)
	}
	want := []time.Duration{1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300}
	for i := range want {
		if got[i] != want[i]*time.Second {
			t.Fatalf("back-offs %v, want %v seconds", got, want)
		}
	}
}

package soakreport

import (
	"strings"
	"testing"
	"time"
)

func TestCompareRSS(t *testing.T) {
	const mb = 1 << 20
	var samples []Sample
	add := func(comp string, gen int, from, to float64, rss func(sec float64) int64) {
		for s := from; s < to; s += 10 {
			samples = append(samples, Sample{T: at(s), Component: comp, Gen: gen, RSS: rss(s), FDs: 20})
		}
	}
	flat := func(v int64) func(float64) int64 { return func(float64) int64 { return v } }
	// Steady: 100 MB, one GC spike in the baseline window that the median ignores.
	add("steady", 0, 0, 1800, func(s float64) int64 {
		if s == 130 {
			return 500 * mb
		}
		return 100 * mb
	})
	// Leaks: grows 1 MB a minute from 100 MB.
	add("leaky", 0, 0, 1800, func(s float64) int64 { return 100*mb + int64(s/60)*mb })
	// Restarted at 600 s at 50 MB (was 200 MB): compared with its own warm-up.
	add("restarted", 0, 0, 600, flat(200*mb))
	add("restarted", 1, 600, 1800, flat(50*mb))
	// Restarted too late for a warm-up.
	add("late", 0, 0, 1650, flat(80*mb))
	add("late", 1, 1650, 1800, flat(90*mb))
	// Shrinks: not a failure.
	add("shrinks", 0, 0, 1800, func(s float64) int64 {
		if s > 1500 {
			return 60 * mb
		}
		return 100 * mb
	})
	rule := RSSRule{WarmEnd: at(120), GenWarmup: time.Minute, Window: time.Minute, EndFrom: at(1740), Tolerance: 0.10}
	got := map[string]RSSCheck{}
	for _, c := range CompareRSS(samples, rule) {
		got[c.Component] = c
	}
	if c := got["steady"]; !c.Compared || !c.OK || c.Baseline != 100*mb || c.End != 100*mb {
		t.Errorf("steady: %+v", c)
	}
	if c := got["leaky"]; !c.Compared || c.OK || c.Growth < 0.2 {
		t.Errorf("leaky: %+v", c)
	}
	if c := got["restarted"]; !c.Compared || !c.OK || c.Restarts != 1 || c.Baseline != 50*mb || !c.BaselineFrom.Equal(at(660)) {
		t.Errorf("restarted: %+v", c)
	}
	if c := got["late"]; c.Compared || !strings.Contains(c.Note, "too late") {
		t.Errorf("late: %+v", c)
	}
	if c := got["shrinks"]; !c.Compared || !c.OK || c.Growth > -0.3 {
		t.Errorf("shrinks: %+v", c)
	}
}

package soakreport

import (
	"fmt"
	"slices"
	"time"
)

// A Sample is one reading of a process's memory and file descriptors.
type Sample struct {
	T         time.Time `json:"t"`
	Component string    `json:"component"`
	// Gen counts the component's restarts: 0 is the process the soak
	// started with.
	Gen int   `json:"gen"`
	PID int   `json:"pid"`
	RSS int64 `json:"rss"` // bytes (VmRSS)
	// Anon is the anonymous part of RSS (RssAnon): without file-backed
	// pages such as a mmapped database.
	Anon int64 `json:"anon"`
	FDs  int   `json:"fds"`
}

// RSSRule says how memory is compared.
type RSSRule struct {
	// WarmEnd is when the soak's warm-up ended: the baseline of the
	// processes that ran from the start is measured from then.
	WarmEnd time.Time
	// GenWarmup is how long a restarted process runs before its own
	// baseline is measured.
	GenWarmup time.Duration
	// Window is how long a baseline is measured over (the median of its
	// samples, so one garbage collection does not decide it).
	Window time.Duration
	// EndFrom: the end value is the median of the samples from then on
	// (churn stopped, everything settled).
	EndFrom time.Time
	// Tolerance is the growth allowed, 0.10 for 10 %.
	Tolerance float64
}

// An RSSCheck compares one component's memory at the end with its value
// after warm-up.
type RSSCheck struct {
	Component string
	// Restarts is how often the soak restarted the component; the
	// comparison is of the last process, against its own warm-up.
	Restarts     int
	BaselineFrom time.Time
	Baseline     int64
	End          int64
	BaselineFDs  int
	EndFDs       int
	// BaselineAnon and EndAnon are the anonymous parts (RssAnon), shown
	// beside: file-backed pages (etcd's mmapped database) count in RSS.
	BaselineAnon, EndAnon int64
	// Growth is End/Baseline - 1.
	Growth float64
	// Compared is false when there is no baseline (the last restart came
	// too late for a warm-up) or no end value; Note says why.
	Compared bool
	OK       bool
	Note     string
}

// CompareRSS checks each component's last process: the median RSS of its
// samples from EndFrom must be at most Tolerance above the median over
// Window from its warm-up's end. A drop is not a failure (memory given
// back is not a leak).
func CompareRSS(samples []Sample, rule RSSRule) []RSSCheck {
	byComp := map[string][]Sample{}
	for _, s := range samples {
		byComp[s.Component] = append(byComp[s.Component], s)
	}
	names := make([]string, 0, len(byComp))
	for n := range byComp {
		names = append(names, n)
	}
	slices.Sort(names)
	var out []RSSCheck
	for _, name := range names {
		ss := byComp[name]
		slices.SortStableFunc(ss, func(a, b Sample) int { return a.T.Compare(b.T) })
		last := ss[len(ss)-1].Gen
		var gen []Sample
		for _, s := range ss {
			if s.Gen == last {
				gen = append(gen, s)
			}
		}
		c := RSSCheck{Component: name, Restarts: last}
		from := rule.WarmEnd
		if last > 0 {
			from = gen[0].T.Add(rule.GenWarmup)
		}
		c.BaselineFrom = from
		base := between(gen, from, from.Add(rule.Window))
		end := between(gen, rule.EndFrom, time.Time{})
		late := from.Add(rule.Window).After(rule.EndFrom)
		switch {
		case last > 0 && (late || len(base) == 0):
			c.Note = fmt.Sprintf("restarted at %s, too late for a %v warm-up before the end: not compared", gen[0].T.Format(time.TimeOnly), rule.GenWarmup)
		case late:
			c.Note = "the warm-up reaches into the end: not compared"
		case len(base) == 0:
			c.Note = "no sample after warm-up: not compared"
		case len(end) == 0:
			c.Note = "no sample at the end: not compared"
		default:
			c.Compared = true
		}
		if len(base) > 0 {
			c.Baseline, c.BaselineFDs, c.BaselineAnon = medianRSS(base), medianFDs(base), medianAnon(base)
		}
		if len(end) > 0 {
			c.End, c.EndFDs, c.EndAnon = medianRSS(end), medianFDs(end), medianAnon(end)
		}
		if c.Compared {
			c.Growth = float64(c.End)/float64(c.Baseline) - 1
			c.OK = c.Growth <= rule.Tolerance
		}
		out = append(out, c)
	}
	return out
}

// between returns the samples with from <= T < to (no upper bound when to
// is zero).
func between(ss []Sample, from, to time.Time) []Sample {
	var out []Sample
	for _, s := range ss {
		if !s.T.Before(from) && (to.IsZero() || s.T.Before(to)) {
			out = append(out, s)
		}
	}
	return out
}

func medianRSS(ss []Sample) int64 {
	v := make([]int64, len(ss))
	for i, s := range ss {
		v[i] = s.RSS
	}
	slices.Sort(v)
	return v[len(v)/2]
}

func medianAnon(ss []Sample) int64 {
	v := make([]int64, len(ss))
	for i, s := range ss {
		v[i] = s.Anon
	}
	slices.Sort(v)
	return v[len(v)/2]
}

func medianFDs(ss []Sample) int {
	v := make([]int, len(ss))
	for i, s := range ss {
		v[i] = s.FDs
	}
	slices.Sort(v)
	return v[len(v)/2]
}

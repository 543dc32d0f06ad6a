package noderuntime

import (
	"cmp"
	"math"
	"slices"
	"time"
)

// The hot pool follows demand. What is kept hot is planned from
// the recent bind mix by pure functions, so the policy is tested without
// containerd: hotMix records binds, hotTargets turns their decayed counts
// into a target per image within the node's budget, hotSurplus says what
// to cool down.

// hotMinDemand is the decayed bind count below which an image has left the
// mix: about one bind within the last half-life.
const hotMinDemand = 0.5

// hotMix is the recent bind mix: the image and time of the last window
// binds that could have used a hot slot. A bind's weight halves every
// halfLife, so an image no longer bound fades out of the mix even when
// nothing else is bound.
type hotMix struct {
	window   int
	halfLife time.Duration
	binds    []mixBind
}

type mixBind struct {
	image string
	at    time.Time
}

func (m *hotMix) add(image string, at time.Time) {
	m.binds = append(m.binds, mixBind{image, at})
	if over := len(m.binds) - m.window; over > 0 {
		m.binds = slices.Delete(m.binds, 0, over)
	}
}

// demand is each image's decayed bind count at now: the sum over its binds
// in the window of 2^(-age/halfLife). Binds whose weight has fallen below
// 1/64 are forgotten.
func (m *hotMix) demand(now time.Time) map[string]float64 {
	d := map[string]float64{}
	keep := 0
	for i, b := range m.binds {
		w := math.Exp2(-float64(now.Sub(b.at)) / float64(m.halfLife))
		if w < 1.0/64 {
			keep = i + 1 // binds are in time order: everything before goes too
			continue
		}
		d[b.image] += w
	}
	m.binds = slices.Delete(m.binds, 0, keep)
	return d
}

// hotTargets is how many hot sandboxes to keep per image, at most budget
// in all:
//   - each pinned image gets one, in the order given;
//   - each image in demand (decayed count ≥ hotMinDemand), most demanded
//     first, gets one;
//   - the rest of the budget goes to the images in demand in proportion to
//     their decayed counts (highest averages, Sainte-Laguë's divisors, which
//     favour neither the big images nor the small), an image never getting
//     more than its count rounded up: a hot sandbox more than the recent
//     binds of its image would likely wait unused;
//   - what is still left goes to the pinned images in turn (the operator
//     asked for them to be hot; with no mix they share the budget).
func hotTargets(budget int, pinned []string, demand map[string]float64) map[string]int {
	want := map[string]int{}
	if budget <= 0 {
		return want
	}
	for _, img := range pinned {
		if budget == 0 {
			return want
		}
		if want[img] == 0 {
			want[img] = 1
			budget--
		}
	}
	var images []string
	for img, w := range demand {
		if w >= hotMinDemand {
			images = append(images, img)
		}
	}
	slices.SortFunc(images, func(a, b string) int {
		return cmp.Or(cmp.Compare(demand[b], demand[a]), cmp.Compare(a, b))
	})
	for _, img := range images {
		if budget == 0 {
			return want
		}
		if want[img] == 0 {
			want[img] = 1
			budget--
		}
	}
	for budget > 0 {
		best, bestQ := "", 0.0
		for _, img := range images {
			if want[img] >= int(math.Ceil(demand[img])) {
				continue
			}
			if q := demand[img] / float64(2*want[img]+1); q > bestQ {
				best, bestQ = img, q
			}
		}
		if best == "" {
			break
		}
		want[best]++
		budget--
	}
	var uniq []string
	for _, img := range pinned {
		if !slices.Contains(uniq, img) {
			uniq = append(uniq, img)
		}
	}
	for i := 0; budget > 0 && len(uniq) > 0; i++ {
		want[uniq[i%len(uniq)]]++
		budget--
	}
	return want
}

// hotSurplus is how many idle hot sandboxes of each image to cool down,
// given the targets and what is hot (or heating) now. An image with no
// target loses all of them; one with a target keeps one more than it (so a
// target that wavers by one neither starts nor cools anything).
func hotSurplus(targets, have map[string]int) map[string]int {
	out := map[string]int{}
	for img, n := range have {
		t := targets[img]
		switch {
		case t == 0 && n > 0:
			out[img] = n
		case t > 0 && n > t+1:
			out[img] = n - t - 1
		}
	}
	return out
}

// hotCoolAfter is how long a hot sandbox waits at least before it may be
// cooled down for want of demand: a tenth of the mix's half-life, at most
// 30 s, so a sandbox just started is never removed straight away.
func hotCoolAfter(halfLife time.Duration) time.Duration {
	return min(halfLife/10, 30*time.Second)
}

// hotSuffix ends the container ID of a slot's hot sandbox.
const hotSuffix = "-hot"

// hotFailure is an image whose hot sandbox failed to start: none is
// started again before until.
type hotFailure struct {
	until time.Time
	delay time.Duration
}

// nextHotBackoff doubles a hot start's back-off, from 1 s to 5 min.
func nextHotBackoff(d time.Duration) time.Duration {
	return min(max(2*d, time.Second), 5*time.Minute)
}

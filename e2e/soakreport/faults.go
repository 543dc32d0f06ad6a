package soakreport

import (
	"math/rand/v2"
	"strings"
	"time"
)

// A Window is one fault, from the moment it was injected until the system
// had recovered from it: the process serves again and the pool has
// converged (every agent healthy, no slot holding a pod that ended or is
// gone). Failures inside a window are what the fault is allowed to cause.
type Window struct {
	Kind   string `json:"kind"`   // e.g. "kill containerd"
	Target string `json:"target"` // the process: name, old and new pid
	// Start is when SIGKILL or SIGSTOP was sent.
	Start time.Time `json:"start"`
	// Restored is when the process ran again (restart or SIGCONT).
	Restored time.Time `json:"restored"`
	// End is when the system had recovered (or when the soak gave up
	// waiting, with Err saying what was still wrong).
	End    time.Time `json:"end"`
	Detail string    `json:"detail,omitempty"`
	Err    string    `json:"err,omitempty"`
}

// Covers reports whether [from, to] overlaps the window, whose end is
// extended by slack: the time a client needs to notice the recovery (its
// poll interval) before it stops using what the fault took away.
func (w Window) Covers(from, to time.Time, slack time.Duration) bool {
	return !to.Before(w.Start) && !from.After(w.End.Add(slack))
}

// Covering returns the first window that covers [from, to].
func Covering(ws []Window, from, to time.Time, slack time.Duration) (Window, bool) {
	for _, w := range ws {
		if w.Covers(from, to, slack) {
			return w, true
		}
	}
	return Window{}, false
}

// A Call is one daemon call made by the churn.
type Call struct {
	Start   time.Time `json:"start"`
	End     time.Time `json:"end"`
	Sandbox string    `json:"sandbox"`
	Op      string    `json:"op"`
	// Err is the error as the caller saw it; empty when the call worked.
	Err string `json:"err,omitempty"`
	// Wrong: the call answered, with the wrong content (another sandbox's
	// hostname, different file bytes). No fault excuses that.
	Wrong bool `json:"wrong,omitempty"`
}

// Failed reports whether the call did not do what was asked.
func (c Call) Failed() bool { return c.Err != "" || c.Wrong }

// CallVerdict judges the churn's daemon calls against the fault log.
type CallVerdict struct {
	Total, Failed int
	// InWindow counts failures covered by a fault window, by fault kind.
	InWindow map[string]int
	// Outside are failures no window covers; Unclear failures whose error
	// does not say what failed; Wrong calls that answered wrongly.
	Outside, Unclear, Wrong []Call
}

// OK reports whether every failure was a clear error inside a window.
func (v CallVerdict) OK() bool {
	return len(v.Outside) == 0 && len(v.Unclear) == 0 && len(v.Wrong) == 0
}

// JudgeCalls sorts the failed calls into those the fault windows excuse
// and those they do not.
func JudgeCalls(calls []Call, ws []Window, slack time.Duration) CallVerdict {
	v := CallVerdict{Total: len(calls), InWindow: map[string]int{}}
	for _, c := range calls {
		if !c.Failed() {
			continue
		}
		v.Failed++
		if c.Wrong {
			v.Wrong = append(v.Wrong, c)
			continue
		}
		if !ClearError(c.Err) {
			v.Unclear = append(v.Unclear, c)
		}
		if w, ok := Covering(ws, c.Start, c.End, slack); ok {
			v.InWindow[w.Kind]++
		} else {
			v.Outside = append(v.Outside, c)
		}
	}
	return v
}

// unclear are messages that do not say what failed.
var unclear = map[string]bool{
	"eof": true, "unexpected eof": true, "context canceled": true, "context deadline exceeded": true,
	"<nil>": true, "error": true, "unknown": true, "internal error": true, "failed": true,
}

// ClearError reports whether an error message says what failed: not
// empty, not a bare generic phrase (EOF, context canceled, …), and not a
// daemon error with an empty message ("sandbox daemon:  (502 http_502)").
func ClearError(msg string) bool {
	m := strings.TrimSpace(msg)
	if m == "" || unclear[strings.ToLower(m)] {
		return false
	}
	if strings.HasPrefix(m, "sandbox daemon:  (") || strings.HasPrefix(m, "sandbox daemon: (") {
		return false
	}
	return true
}

// PlanFaults returns each kind repeats times in a random order (from r, so
// a seed repeats the plan), with no kind twice in a row where that can be
// avoided.
func PlanFaults(r *rand.Rand, kinds []string, repeats int) []string {
	left := map[string]int{}
	var order []string
	for _, k := range kinds {
		if _, ok := left[k]; !ok {
			order = append(order, k)
		}
		left[k] += repeats
	}
	n := len(kinds) * repeats
	plan := make([]string, 0, n)
	prev := ""
	for ; n > 0; n-- {
		var ok, any []string
		for _, k := range order {
			if left[k] == 0 {
				continue
			}
			any = append(any, k)
			if k != prev && canFollow(left, k, n) {
				ok = append(ok, k)
			}
		}
		if len(ok) == 0 { // only one kind is left: it repeats
			ok = any
		}
		k := ok[r.IntN(len(ok))]
		plan = append(plan, k)
		left[k]--
		prev = k
	}
	return plan
}

// canFollow reports whether, with n faults left (counts in left), taking k
// next still lets the rest avoid repeats: k, which may not come next again,
// fits in every second place of the n-1 after it, every other kind in half
// of them rounded up.
func canFollow(left map[string]int, k string, n int) bool {
	for kind, c := range left {
		if kind == k {
			c--
			if c > (n-1)/2 {
				return false
			}
		} else if c > n/2 {
			return false
		}
	}
	return true
}

// NextGap is the pause before the next fault: the time left until the
// last moment a fault may start, less what the remaining faults are
// expected to take, shared among the gaps still to come, and drawn from
// half to one and a half times that share; never below minGap.
func NextGap(r *rand.Rand, left, remainingFaults time.Duration, faultsLeft int, minGap time.Duration) time.Duration {
	share := (left - remainingFaults) / time.Duration(faultsLeft+1)
	if share < minGap {
		return minGap
	}
	g := time.Duration(float64(share) * (0.5 + r.Float64()))
	return max(g, minGap)
}

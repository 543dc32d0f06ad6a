package pool

import (
	"slices"
	"time"
)

// BindWindow is how far back a node's bind statistics look.
const BindWindow = 5 * time.Minute

// bindRingSize bounds the binds remembered per node.
const bindRingSize = 4096

// bindRing keeps a node's recent bind calls (guarded by Pool.mu).
type bindRing struct {
	at   []time.Time
	took []time.Duration
	ok   []bool
	next int
}

func (r *bindRing) add(at time.Time, took time.Duration, ok bool) {
	if len(r.at) < bindRingSize {
		r.at, r.took, r.ok = append(r.at, at), append(r.took, took), append(r.ok, ok)
		return
	}
	r.at[r.next], r.took[r.next], r.ok[r.next] = at, took, ok
	r.next = (r.next + 1) % bindRingSize
}

// BindStats summarises a node's bind calls over the last BindWindow.
type BindStats struct {
	Count, Failed int
	P50, P99      time.Duration
}

func (r *bindRing) stats(now time.Time) BindStats {
	var st BindStats
	var ok []time.Duration
	for i, at := range r.at {
		if now.Sub(at) > BindWindow {
			continue
		}
		st.Count++
		if !r.ok[i] {
			st.Failed++
			continue
		}
		ok = append(ok, r.took[i])
	}
	if len(ok) > 0 {
		slices.Sort(ok)
		st.P50 = ok[(len(ok)-1)/2]
		st.P99 = ok[(len(ok)-1)*99/100]
	}
	return st
}

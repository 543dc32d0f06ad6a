package soakreport

import (
	"slices"
)

// An Entry is one line of a census: how many of something there are and,
// where that helps a diff, which.
type Entry struct {
	Name  string   `json:"name"`
	N     int      `json:"n"`
	Items []string `json:"items,omitempty"`
	// Info entries are shown but not compared: things on the host that
	// the soak does not own (the whole mount table, every iptables rule).
	Info bool `json:"info,omitempty"`
	// Err says why the entry could not be counted.
	Err string `json:"err,omitempty"`
}

// A Census is what the soak counts on the machine, in a stable order.
type Census []Entry

// Get returns the entry called name.
func (c Census) Get(name string) (Entry, bool) {
	i := slices.IndexFunc(c, func(e Entry) bool { return e.Name == name })
	if i < 0 {
		return Entry{}, false
	}
	return c[i], true
}

// A Delta is an entry whose count differs between two censuses, or whose
// members changed while the count stayed (a slot recycled: not a leak, but
// shown).
type Delta struct {
	Name          string
	Before, After int
	Added         []string
	Removed       []string
	Info          bool
	// Err: the entry could not be counted in one of the censuses.
	Err string
}

// Counted reports whether the delta is a difference in count (or a count
// that failed), as opposed to members replaced one for one.
func (d Delta) Counted() bool { return d.Before != d.After || d.Err != "" }

// Diff lists the entries of before and after that differ, in before's
// order followed by entries only after has.
func Diff(before, after Census) []Delta {
	var names []string
	seen := map[string]bool{}
	for _, c := range []Census{before, after} {
		for _, e := range c {
			if !seen[e.Name] {
				seen[e.Name] = true
				names = append(names, e.Name)
			}
		}
	}
	var out []Delta
	for _, name := range names {
		b, _ := before.Get(name)
		a, _ := after.Get(name)
		d := Delta{Name: name, Before: b.N, After: a.N, Info: b.Info || a.Info}
		switch {
		case b.Err != "":
			d.Err = "before: " + b.Err
		case a.Err != "":
			d.Err = "after: " + a.Err
		}
		d.Added, d.Removed = setDiff(a.Items, b.Items), setDiff(b.Items, a.Items)
		if d.Counted() || len(d.Added) > 0 || len(d.Removed) > 0 {
			out = append(out, d)
		}
	}
	return out
}

// Leaks are the deltas that fail a soak: counts that differ in entries the
// soak owns.
func Leaks(ds []Delta) []Delta {
	var out []Delta
	for _, d := range ds {
		if d.Counted() && !d.Info {
			out = append(out, d)
		}
	}
	return out
}

// setDiff returns the members of a not in b, sorted.
func setDiff(a, b []string) []string {
	in := map[string]bool{}
	for _, s := range b {
		in[s] = true
	}
	var out []string
	for _, s := range a {
		if !in[s] {
			out = append(out, s)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

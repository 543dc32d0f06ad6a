package noderuntime

import (
	"context"
	"strings"
	"testing"
)

// TestPickGroup: a new slot joins the fullest group with room, by name on
// ties; none when all are full.
func TestPickGroup(t *testing.T) {
	for _, tc := range []struct {
		name   string
		groups map[string]int
		want   string
	}{
		{"none", nil, ""},
		{"all full", map[string]int{"a": 8, "b": 8}, ""},
		{"fullest with room", map[string]int{"a": 2, "b": 7, "c": 8}, "b"},
		{"tie by name", map[string]int{"b": 3, "a": 3}, "a"},
		{"empty group", map[string]int{"a": 0}, "a"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			groups := map[string]*shimGroup{}
			for n, slots := range tc.groups {
				groups[n] = &shimGroup{slots: slots}
			}
			if got := pickGroup(groups, 8); got != tc.want {
				t.Fatalf("pickGroup = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestGroupMembership: grouped, slots fill a group before another is made,
// re-adopted slots count in their own group, and the last slot out drops
// its group (no holder ran, so nothing is removed); ungrouped, every slot
// and bind gets a fresh name and nothing is tracked.
func TestGroupMembership(t *testing.T) {
	r := &Runtime{cfg: Config{Node: "n", ShimGroupSize: 2}, groups: map[string]*shimGroup{}}
	a, b, c := r.joinGroupLocked(), r.joinGroupLocked(), r.joinGroupLocked()
	if a != b || c == a || !strings.HasPrefix(a, "n-shim-") {
		t.Fatalf("groups %q %q %q: want the first two together, the third apart", a, b, c)
	}
	if got := r.rejoinGroupLocked("old"); got != "old" || r.groups["old"].slots != 1 {
		t.Fatalf("re-adopted into %q (%+v)", got, r.groups["old"])
	}
	if got := r.joinGroupLocked(); got != c && got != "old" {
		t.Fatalf("a slot made a new group (%q) while two had room", got)
	}
	ctx := context.Background()
	if err := r.leaveGroup(ctx, a); err != nil || r.groups[a] == nil {
		t.Fatalf("group dropped with a slot left: %v", err)
	}
	if err := r.leaveGroup(ctx, a); err != nil || r.groups[a] != nil {
		t.Fatalf("empty group kept: %v", err)
	}
	// Ungrouped: fresh names, per slot and per bind.
	s := &slot{group: "x"}
	u := &Runtime{cfg: Config{Node: "n", ShimGroupSize: 1}, groups: map[string]*shimGroup{}}
	if g1, g2 := u.joinGroupLocked(), u.joinGroupLocked(); g1 == g2 {
		t.Fatalf("ungrouped slots share %q", g1)
	}
	if g := u.bindGroupLocked(s); g == "x" || g != s.group {
		t.Fatalf("ungrouped bind group %q (slot's %q)", g, s.group)
	}
	if len(u.groups) != 0 {
		t.Fatalf("ungrouped runtime tracks groups: %v", u.groups)
	}
}

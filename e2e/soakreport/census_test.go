package soakreport

import (
	"slices"
	"testing"
)

func TestCensusDiff(t *testing.T) {
	before := Census{
		{Name: "containers", N: 0},
		{Name: "snapshots", N: 2, Items: []string{"sha256:a", "sha256:b"}},
		{Name: "netns", N: 3, Items: []string{"cni-1", "cni-2", "cni-3"}},
		{Name: "mounts (host)", N: 40, Info: true},
		{Name: "iptables", N: 10},
	}
	after := Census{
		{Name: "containers", N: 1, Items: []string{"slot-9-task"}},
		{Name: "snapshots", N: 2, Items: []string{"sha256:a", "sha256:b"}},
		{Name: "netns", N: 3, Items: []string{"cni-1", "cni-2", "cni-4"}},
		{Name: "mounts (host)", N: 41, Info: true},
		{Name: "iptables", Err: "iptables-save: not found"},
		{Name: "shims", N: 1},
	}
	ds := Diff(before, after)
	var names []string
	for _, d := range ds {
		names = append(names, d.Name)
	}
	if want := []string{"containers", "netns", "mounts (host)", "iptables", "shims"}; !slices.Equal(names, want) {
		t.Fatalf("deltas %v, want %v", names, want)
	}
	if d := ds[0]; d.Before != 0 || d.After != 1 || !slices.Equal(d.Added, []string{"slot-9-task"}) {
		t.Errorf("containers: %+v", d)
	}
	if d := ds[1]; d.Counted() || !slices.Equal(d.Added, []string{"cni-4"}) || !slices.Equal(d.Removed, []string{"cni-3"}) {
		t.Errorf("netns (members replaced, same count): %+v", d)
	}
	var leaks []string
	for _, d := range Leaks(ds) {
		leaks = append(leaks, d.Name)
	}
	if want := []string{"containers", "iptables", "shims"}; !slices.Equal(leaks, want) {
		t.Errorf("leaks %v, want %v (host-wide entries and replaced members are not leaks, a census that failed is)", leaks, want)
	}
	if ds := Diff(before, before); len(ds) != 0 {
		t.Errorf("a census differs from itself: %+v", ds)
	}
}

func TestBindings(t *testing.T) {
	slots := []BoundSlot{
		{Agent: "w0", Slot: "slot-a", UID: "u1", Pod: "ns/p1"},
		{Agent: "w1", Slot: "slot-b", UID: "u1", Pod: "ns/p1"},
		{Agent: "w0", Slot: "slot-c", UID: "u2", Pod: "ns/p2"},
		{Agent: "w1", Slot: "slot-d", UID: "u3", Pod: "ns/p3"},
	}
	got := DoubleBound(slots)
	if len(got) != 1 || got[0] != "pod ns/p1 (uid u1) bound 2 times: [w0/slot-a w1/slot-b]" {
		t.Errorf("double bound: %q", got)
	}
	pods := []PodState{{UID: "u1", Name: "p1"}, {UID: "u2", Name: "p2", Terminal: true}}
	want := []string{"w0/slot-c holds ns/p2, which has ended", "w1/slot-d holds ns/p3, gone from the API"}
	if got := Orphans(slots, pods); !slices.Equal(got, want) {
		t.Errorf("orphans %q, want %q", got, want)
	}
	shared := SharedAddresses(map[string]string{"a": "10.0.0.1", "b": "10.0.0.2", "c": "10.0.0.1", "d": ""})
	if !slices.Equal(shared, []string{"10.0.0.1: [a c]"}) {
		t.Errorf("shared addresses %q", shared)
	}
}

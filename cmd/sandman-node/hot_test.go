package main

import "testing"

func TestHotBudget(t *testing.T) {
	for _, tc := range []struct {
		spec        string
		slots, warm int
		want        int
		err         bool
	}{
		{spec: "auto", slots: 16, warm: 4, want: 4},
		{spec: "auto", slots: 2, warm: 2, want: 2},
		{spec: "0", slots: 16, warm: 4, want: 0},
		{spec: "8", slots: 16, warm: 4, want: 8},
		{spec: "40", slots: 16, warm: 4, want: 16},
		{spec: "-1", slots: 16, warm: 4, err: true},
		{spec: "half", slots: 16, warm: 4, err: true},
	} {
		got, err := hotBudget(tc.spec, tc.slots, tc.warm)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("hotBudget(%q, %d, %d) = %d, %v; want %d (error: %v)", tc.spec, tc.slots, tc.warm, got, err, tc.want, tc.err)
		}
	}
}

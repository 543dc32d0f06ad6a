package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestPick(t *testing.T) {
	for _, tc := range []struct {
		only    string
		want    []string
		wantErr bool
	}{
		{only: "all", want: []string{"daemon", "node", "vk", "image", "e2b"}},
		{only: "scale", want: []string{"scale"}},
		// The registry's order, whatever the order asked for.
		{only: "vk,daemon", want: []string{"daemon", "vk"}},
		{only: "all,scale", want: []string{"daemon", "node", "vk", "image", "e2b", "scale"}},
		{only: "daemon,daemon", want: []string{"daemon"}},
		{only: "nosuch", wantErr: true},
		{only: "daemon,nosuch", wantErr: true},
		{only: "", wantErr: true},
	} {
		t.Run(tc.only, func(t *testing.T) {
			got, err := pick(tc.only)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("pick(%q) = %v, want an error", tc.only, names(got))
				}
				return
			}
			if err != nil {
				t.Fatalf("pick(%q): %v", tc.only, err)
			}
			if !slices.Equal(names(got), tc.want) {
				t.Errorf("pick(%q) = %v, want %v", tc.only, names(got), tc.want)
			}
		})
	}
}

func names(ss []suite) []string {
	var n []string
	for _, s := range ss {
		n = append(n, s.name)
	}
	return n
}

// TestHelpListsEverySuite: make help's bench line and hack/bench.sh's
// header list every suite, and which of them all runs, as registered.
func TestHelpListsEverySuite(t *testing.T) {
	all := strings.Join(suiteNames(true), ",")
	named := strings.Join(suiteNames(false), ",")
	for _, tc := range []struct {
		file string
		want []string
	}{
		{"Makefile", []string{"all, the default: " + all + ";", "named only: " + named + ")"}},
		{"hack/bench.sh", []string{"#   all, the default: " + all + "\n", "#   named only: " + named + " "}},
	} {
		b, err := os.ReadFile(filepath.Join("..", "..", tc.file))
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range tc.want {
			if !strings.Contains(string(b), want) {
				t.Errorf("%s does not say %q: list the suites hack/bench/main.go registers", tc.file, strings.TrimSpace(want))
			}
		}
	}
}

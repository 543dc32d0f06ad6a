package main

import (
	"bytes"
	"log/slog"
	"maps"
	"reflect"
	"strings"
	"testing"
)

// TestPoolAccessFlags: --allowed-namespaces and
// --allowed-namespace-selector parse into the provider's rule; neither
// leaves the pool open with a warning; bad values are refused by flag.
func TestPoolAccessFlags(t *testing.T) {
	for _, tc := range []struct {
		names, selector string
		wantNames       []string
		wantSel         string
		err, warn       string
	}{
		{names: "", selector: "", warn: "pool open to every namespace"},
		{names: "a, b,", wantNames: []string{"a", "b"}},
		{selector: "team=ml", wantSel: "team=ml"},
		{names: "a", selector: "sandman.io/pool-x in (true)", wantNames: []string{"a"}, wantSel: "sandman.io/pool-x in (true)"},
		{names: "Not_A_Namespace", err: "--allowed-namespaces"},
		{selector: "team in (", err: "--allowed-namespace-selector"},
		{selector: " ", warn: "pool open to every namespace"},
	} {
		var logs bytes.Buffer
		log := slog.New(slog.NewTextHandler(&logs, nil))
		names, sel, err := poolAccess(tc.names, tc.selector, "p", log)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q %q: err %v, want one naming %s", tc.names, tc.selector, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q %q: %v", tc.names, tc.selector, err)
			continue
		}
		if !reflect.DeepEqual(names, tc.wantNames) {
			t.Errorf("%q: names %q, want %q", tc.names, names, tc.wantNames)
		}
		if got := ""; sel != nil {
			if got = sel.String(); got != tc.wantSel {
				t.Errorf("%q: selector %q, want %q", tc.selector, got, tc.wantSel)
			}
		} else if tc.wantSel != "" {
			t.Errorf("%q: no selector", tc.selector)
		}
		if warned := strings.Contains(logs.String(), "level=WARN"); warned != (tc.warn != "") || !strings.Contains(logs.String(), tc.warn) {
			t.Errorf("%q %q: log %q, want a warning %q", tc.names, tc.selector, logs.String(), tc.warn)
		}
	}
}

func TestNamespaceWeightFlag(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want map[string]int
		err  string
	}{
		{args: nil, want: nil},
		{args: []string{"ml=2"}, want: map[string]int{"ml": 2}},
		{args: []string{"ml=2,rl=3", "ml=5"}, want: map[string]int{"ml": 5, "rl": 3}},
		{args: []string{"ml"}, err: "want namespace=weight"},
		{args: []string{"ml=0"}, err: "from 1 to 1000000"},
		{args: []string{"ml=x"}, err: "from 1 to 1000000"},
		{args: []string{"Bad_NS=2"}, err: "not a namespace name"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			var w namespaceWeights
			var err error
			for _, a := range tc.args {
				if err = w.Set(a); err != nil {
					break
				}
			}
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("Set(%v) = %v, want an error with %q", tc.args, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(map[string]int(w), tc.want) {
				t.Errorf("Set(%v) = %v, want %v", tc.args, w, tc.want)
			}
		})
	}
}

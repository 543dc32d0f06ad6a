package main

import (
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
)

// poolAccess reads the pool's access rule from --allowed-namespaces and
// --allowed-namespace-selector (vk.Config.AllowedNamespaces,
// AllowedNamespaceSelector). With neither, every namespace may use the
// pool, as before the rule existed, and log says so.
func poolAccess(names, selector, pool string, log *slog.Logger) ([]string, labels.Selector, error) {
	allowed, err := namespaceList("--allowed-namespaces", names)
	if err != nil {
		return nil, nil, err
	}
	var sel labels.Selector
	if s := strings.TrimSpace(selector); s != "" {
		if sel, err = labels.Parse(s); err != nil {
			return nil, nil, fmt.Errorf("--allowed-namespace-selector %q: %w", s, err)
		}
		if sel.Empty() {
			return nil, nil, fmt.Errorf("--allowed-namespace-selector %q selects every namespace: give a label (team=ml), or neither flag for an open pool", s)
		}
	}
	if len(allowed) == 0 && sel == nil {
		log.Warn("pool open to every namespace: any pod that reaches the virtual node (a toleration, or spec.nodeName set by hand) runs here; "+
			"name the namespaces that may use it with --allowed-namespaces or --allowed-namespace-selector", "pool", pool)
	} else {
		log.Info("pool access", "pool", pool, "namespaces", allowed, "selector", fmt.Sprint(sel))
	}
	return allowed, sel, nil
}

// namespaceList parses a comma-separated list of namespace names (flag
// names it in errors); empty: none.
func namespaceList(flag, v string) ([]string, error) {
	var out []string
	for n := range strings.SplitSeq(v, ",") {
		if n = strings.TrimSpace(n); n == "" {
			continue
		}
		if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
			return nil, fmt.Errorf("%s: %q is not a namespace name: %s", flag, n, strings.Join(errs, "; "))
		}
		out = append(out, n)
	}
	return out, nil
}

// commaList splits a comma-separated flag value, dropping blanks.
func commaList(v string) []string {
	var out []string
	for s := range strings.SplitSeq(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			out = append(out, s)
		}
	}
	return out
}

// namespaceWeights is --namespace-weight, repeatable: ns=N gives namespace
// ns N shares of the pool where others have 1 (pool.Config.NamespaceWeights).
type namespaceWeights map[string]int

func (w *namespaceWeights) String() string {
	if w == nil || len(*w) == 0 {
		return ""
	}
	parts := make([]string, 0, len(*w))
	for ns, n := range *w {
		parts = append(parts, fmt.Sprintf("%s=%d", ns, n))
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

func (w *namespaceWeights) Set(v string) error {
	for part := range strings.SplitSeq(v, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		ns, n, ok := strings.Cut(part, "=")
		if !ok {
			return fmt.Errorf("%q: want namespace=weight (ml=2)", part)
		}
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return fmt.Errorf("%q is not a namespace name: %s", ns, strings.Join(errs, "; "))
		}
		weight, err := strconv.Atoi(n)
		if err != nil || weight < 1 || weight > 1_000_000 {
			return fmt.Errorf("%q: the weight must be a whole number from 1 to 1000000", part)
		}
		if *w == nil {
			*w = namespaceWeights{}
		}
		(*w)[ns] = weight
	}
	return nil
}

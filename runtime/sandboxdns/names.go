package sandboxdns

import (
	"strings"

	"github.com/sandman-dev/sandman/runtime"
)

// Names are the DNS names a sandbox may resolve: exact names
// (api.example.com) and wildcards of one leading label (*.example.com:
// any name under example.com, at any depth, but not example.com itself).
type Names struct {
	exact map[string]bool
	// under are the wildcards' domains with a leading dot (".example.com").
	under []string
}

// ParseNames checks names (runtime.CheckEgressDomains) and returns them
// as Names.
func ParseNames(names []string) (Names, error) {
	if err := runtime.CheckEgressDomains(names); err != nil {
		return Names{}, err
	}
	n := Names{exact: map[string]bool{}}
	for _, name := range names {
		if rest, ok := strings.CutPrefix(name, "*."); ok {
			n.under = append(n.under, "."+rest)
			continue
		}
		n.exact[name] = true
	}
	return n, nil
}

// Allows reports whether name (any case, with or without a trailing dot)
// is one of n.
func (n Names) Allows(name string) bool {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if n.exact[name] {
		return true
	}
	for _, u := range n.under {
		if len(name) > len(u) && strings.HasSuffix(name, u) {
			return true
		}
	}
	return false
}

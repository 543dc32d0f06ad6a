package sandboxdns

import (
	"fmt"
	"strings"
)

// MaxNames bounds the names one sandbox may be allowed.
const MaxNames = 64

// Names are the DNS names a sandbox may resolve: exact names
// (api.example.com) and wildcards of one leading label (*.example.com:
// any name under example.com, at any depth, but not example.com itself).
type Names struct {
	exact map[string]bool
	// under are the wildcards' domains with a leading dot (".example.com").
	under []string
}

// ParseNames checks names (each as CheckName says, at most MaxNames) and
// returns them as Names.
func ParseNames(names []string) (Names, error) {
	if len(names) > MaxNames {
		return Names{}, fmt.Errorf("%d names: at most %d are allowed", len(names), MaxNames)
	}
	n := Names{exact: map[string]bool{}}
	for _, name := range names {
		if err := CheckName(name); err != nil {
			return Names{}, err
		}
		if rest, ok := strings.CutPrefix(name, "*."); ok {
			n.under = append(n.under, "."+rest)
			continue
		}
		n.exact[name] = true
	}
	return n, nil
}

// CheckName checks one allowed name: lowercase, without a trailing dot,
// RFC 1123 labels (letters, digits and hyphens, 1 to 63 characters, no
// hyphen at either end), 253 characters at most, not an IPv4 address
// (its last label is not all digits), and at most one wildcard, as the
// whole first label of a name of at least two more labels.
func CheckName(name string) error {
	host, wild := strings.CutPrefix(name, "*.")
	if len(name) > 253 {
		return fmt.Errorf("name %q: longer than 253 characters", name)
	}
	labels := strings.Split(host, ".")
	if wild && len(labels) < 2 {
		return fmt.Errorf("name %q: a wildcard stands for the first label of a domain of at least two, such as *.example.com", name)
	}
	for _, l := range labels {
		if len(l) == 0 || len(l) > 63 {
			return fmt.Errorf("name %q: labels are 1 to 63 characters (no empty label, no trailing dot)", name)
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			return fmt.Errorf("name %q: a label may not begin or end with a hyphen", name)
		}
		for _, c := range l {
			switch {
			case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '-':
			case c == '*':
				return fmt.Errorf("name %q: only a whole first label may be a wildcard, as in *.example.com", name)
			default:
				return fmt.Errorf("name %q: want lowercase letters, digits, hyphens and dots", name)
			}
		}
	}
	if strings.Trim(labels[len(labels)-1], "0123456789") == "" {
		return fmt.Errorf("name %q: is an address, not a name (give addresses in sandman.io/egress)", name)
	}
	return nil
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

package runtime

import (
	"fmt"
	"strings"
)

// MaxEgressDomains bounds the names one sandbox may be allowed
// (BindRequest.EgressDomains).
const MaxEgressDomains = 64

// CheckEgressDomains checks the names a sandbox may be allowed: at most
// MaxEgressDomains, each as CheckEgressDomain says. The node's resolver
// (runtime/sandboxnet, runtime/sandboxdns) matches them.
func CheckEgressDomains(names []string) error {
	if len(names) > MaxEgressDomains {
		return fmt.Errorf("%d names: at most %d are allowed", len(names), MaxEgressDomains)
	}
	for _, name := range names {
		if err := CheckEgressDomain(name); err != nil {
			return err
		}
	}
	return nil
}

// CheckEgressDomain checks one name a sandbox may be allowed
// (BindRequest.EgressDomains): lowercase, without a trailing dot,
// RFC 1123 labels (letters, digits and hyphens, 1 to 63 characters, no
// hyphen at either end), 253 characters at most, not an IPv4 address
// (its last label is not all digits), and at most one wildcard, as the
// whole first label of a name of at least two more labels.
func CheckEgressDomain(name string) error {
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

package gateway

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	"k8s.io/apimachinery/pkg/util/validation"
)

// The node's per-pod egress contract (vk, runtime/sandboxnet): what a
// sandbox's pod may reach beyond the pool's own rules, which these only
// narrow.
const (
	// AnnotationEgress narrows the sandbox's internet egress to these
	// comma-separated IPv4 CIDRs; egressNone allows it none.
	AnnotationEgress = "sandman.io/egress"
	// AnnotationEgressDeny are comma-separated IPv4 CIDRs the sandbox may
	// never reach.
	AnnotationEgressDeny = "sandman.io/egress-deny"

	egressNone = "none"
)

// egressAnnotations maps E2B's allow_internet_access and
// network.allowOut/denyOut onto the node's egress annotations (none when
// nothing narrows egress).
//
// E2B's rules: allowOut takes precedence over denyOut; 0.0.0.0/0
// (ALL_TRAFFIC) in denyOut denies everything not allowed, and
// allow_internet_access: false is the same as denyOut [0.0.0.0/0]. So:
//   - everything denied: sandman.io/egress is the allowOut ranges, or
//     none;
//   - otherwise: sandman.io/egress-deny is the denyOut ranges, less those
//     an allowOut range covers (allowed, since allow wins). An allowOut
//     range inside a narrower denyOut range would be a hole in a denied
//     range while the rest of the internet is open, which the node cannot
//     express: refused.
//
// Entries are IPv4 CIDRs or addresses (a /32). Sandboxes have no IPv6: an
// IPv6 allowOut entry is refused, an IPv6 denyOut entry is what is
// already so. Domain names are refused, saying so: never dropped.
func egressAnnotations(internet *bool, n *networkConfig) (map[string]string, error) {
	var allow, deny []netip.Prefix
	if n != nil {
		var err error
		if allow, err = egressPrefixes("allowOut", n.AllowOut); err != nil {
			return nil, err
		}
		if deny, err = egressPrefixes("denyOut", n.DenyOut); err != nil {
			return nil, err
		}
	}
	denyAll := internet != nil && !*internet
	for _, d := range deny {
		denyAll = denyAll || d.Bits() == 0
	}
	if denyAll {
		if len(allow) == 0 {
			return map[string]string{AnnotationEgress: egressNone}, nil
		}
		return map[string]string{AnnotationEgress: joinPrefixes(allow)}, nil
	}
	var kept []netip.Prefix
	for _, d := range deny {
		covered := false
		for _, a := range allow {
			if !a.Overlaps(d) {
				continue
			}
			if a.Bits() > d.Bits() {
				return nil, errorf(errdefs.ErrInvalidArgument, "network: allowOut %s lies inside denyOut %s while the rest of the internet is open: "+
					"sandman cannot allow a part of a denied range; deny the ranges around it instead, or deny all traffic (0.0.0.0/0) and allow what the sandbox needs", a, d)
			}
			covered = true // allowOut wins over denyOut
		}
		if !covered {
			kept = append(kept, d)
		}
	}
	if len(kept) == 0 {
		return nil, nil
	}
	return map[string]string{AnnotationEgressDeny: joinPrefixes(kept)}, nil
}

// egressPrefixes reads one of E2B's lists: IPv4 CIDRs and addresses, as
// masked prefixes, sorted, without duplicates; IPv6 ones left out of
// denyOut.
func egressPrefixes(field string, entries []string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, raw := range entries {
		e := strings.TrimSpace(raw)
		p, err := netip.ParsePrefix(e)
		if err != nil {
			a, aerr := netip.ParseAddr(e)
			if aerr != nil {
				if isDomain(e) {
					return nil, errorf(errdefs.ErrInvalidArgument, "network.%s: %q is a domain name: egress rules by domain are not supported by sandman's gateway yet; give IP addresses or CIDRs", field, raw)
				}
				return nil, errorf(errdefs.ErrInvalidArgument, "network.%s: %q is not an IP address or CIDR (such as 203.0.113.7 or 203.0.113.0/24)", field, raw)
			}
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), max(0, p.Bits()-96))
		}
		if !p.Addr().Is4() {
			if field == "denyOut" {
				continue // sandboxes never reach IPv6
			}
			return nil, errorf(errdefs.ErrInvalidArgument, "network.%s: %q is IPv6: sandboxes have no IPv6 egress; give IPv4 addresses or CIDRs", field, raw)
		}
		out = append(out, p.Masked())
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	return slices.Compact(out), nil
}

// isDomain says whether an entry is a host name, or a wildcard one
// (*.example.com), as E2B's domain rules take them.
func isDomain(e string) bool {
	name := strings.TrimPrefix(strings.ToLower(strings.TrimSuffix(e, ".")), "*.")
	return name != "" && len(validation.IsDNS1123Subdomain(name)) == 0
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

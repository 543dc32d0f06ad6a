package gateway

import (
	"net/netip"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/sandman-dev/sandman/podcontract"
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
// already so. Domain names (api.example.com, *.example.com) are taken in
// allowOut when everything else is denied, as E2B takes them: they become
// sandman.io/egress-domains, which the node resolves through a resolver of
// its own. Elsewhere a name is refused, saying why: never dropped.
func egressAnnotations(internet *bool, n *networkConfig) (map[string]string, error) {
	var allow, deny []netip.Prefix
	var domains []string
	if n != nil {
		var err error
		if allow, domains, err = egressEntries("allowOut", n.AllowOut); err != nil {
			return nil, err
		}
		var denied []string
		if deny, denied, err = egressEntries("denyOut", n.DenyOut); err != nil {
			return nil, err
		}
		if len(denied) > 0 {
			return nil, errorf(errdefs.ErrInvalidArgument, "network.denyOut: %q is a domain name: a sandbox could reach the same addresses by IP, so names are taken only in allowOut "+
				"(deny all traffic, 0.0.0.0/0, and allow the names the sandbox needs)", denied[0])
		}
	}
	denyAll := internet != nil && !*internet
	for _, d := range deny {
		denyAll = denyAll || d.Bits() == 0
	}
	if denyAll {
		out := map[string]string{}
		if len(allow) > 0 {
			out[podcontract.AnnotationEgress] = joinPrefixes(allow)
		}
		if len(domains) > 0 {
			out[podcontract.AnnotationEgressDomains] = strings.Join(domains, ",")
		}
		if len(out) == 0 {
			out[podcontract.AnnotationEgress] = podcontract.EgressNone
		}
		return out, nil
	}
	if len(domains) > 0 {
		return nil, errorf(errdefs.ErrInvalidArgument, "network.allowOut: %q is a domain name, which narrows egress only when everything else is denied: "+
			"add 0.0.0.0/0 (ALL_TRAFFIC) to denyOut, or leave the name out (the internet is open)", domains[0])
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
	return map[string]string{podcontract.AnnotationEgressDeny: joinPrefixes(kept)}, nil
}

// egressEntries reads one of E2B's lists: IPv4 CIDRs and addresses, as
// masked prefixes, sorted, without duplicates (IPv6 ones left out of
// denyOut), and domain names, lower-cased, sorted, without duplicates.
func egressEntries(field string, entries []string) ([]netip.Prefix, []string, error) {
	var out []netip.Prefix
	var domains []string
	for _, raw := range entries {
		e := strings.TrimSpace(raw)
		p, err := netip.ParsePrefix(e)
		if err != nil {
			a, aerr := netip.ParseAddr(e)
			if aerr != nil {
				if name, ok := domainName(e); ok {
					domains = append(domains, name)
					continue
				}
				return nil, nil, errorf(errdefs.ErrInvalidArgument, "network.%s: %q is not an IP address, CIDR or domain name (such as 203.0.113.7, 203.0.113.0/24 or *.example.com)", field, raw)
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
			return nil, nil, errorf(errdefs.ErrInvalidArgument, "network.%s: %q is IPv6: sandboxes have no IPv6 egress; give IPv4 addresses or CIDRs", field, raw)
		}
		out = append(out, p.Masked())
	}
	slices.SortFunc(out, func(a, b netip.Prefix) int {
		if c := a.Addr().Compare(b.Addr()); c != 0 {
			return c
		}
		return a.Bits() - b.Bits()
	})
	slices.Sort(domains)
	return slices.Compact(out), slices.Compact(domains), nil
}

// domainName reads a host name, or a wildcard one (*.example.com), as
// E2B's domain rules take them: lower-cased, without a trailing dot. The
// node checks names again (sandman.io/egress-domains), and refuses what it
// cannot resolve safely (*.com, say) with the pod's InvalidSpec.
func domainName(e string) (string, bool) {
	name := strings.ToLower(strings.TrimSuffix(e, "."))
	host := strings.TrimPrefix(name, "*.")
	return name, host != "" && strings.Contains(host, ".") && len(validation.IsDNS1123Subdomain(host)) == 0
}

func joinPrefixes(ps []netip.Prefix) string {
	s := make([]string, len(ps))
	for i, p := range ps {
		s[i] = p.String()
	}
	return strings.Join(s, ",")
}

package nodeimage

import (
	"cmp"
	"fmt"
	"net"
	"slices"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
)

// SnapshotRepositories are the repositories where snapshots of sandboxes
// are kept by namespace: under a repository host[:port]/prefix, the path
// component right after the prefix is the Kubernetes namespace that owns
// the image (<prefix>/<namespace>/<name>:<tag>, as the gateway names E2B
// snapshots). A namespace's snapshots are its own: a pod of another
// namespace may not start one (CheckStart), whatever its pull secrets and
// whether or not the image is on the node, and a snapshot of a pod is
// written only under its own namespace (CheckWrite). The registry cannot
// tell namespaces apart (the nodes pull with no pod's credentials), so
// this check is what keeps them apart.
//
// An image counts as under a repository when its registry host is the
// repository's (case aside, :443 or not) or is an IP address or localhost
// at the repository's port (the same registry reached by another name);
// other names of the registry (DNS aliases) must be listed too.
type SnapshotRepositories struct {
	repos []snapshotRepo
}

type snapshotRepo struct {
	// name is as configured (for messages); host and port are the
	// registry's, path the prefix (may be empty).
	name, host, port, path string
}

// ParseSnapshotRepositories parses host[:port][/prefix] values. None:
// snapshots are not kept by namespace (every check passes).
func ParseSnapshotRepositories(values []string) (SnapshotRepositories, error) {
	var s SnapshotRepositories
	for _, v := range values {
		named, err := reference.ParseNamed(v + "/x")
		first, _, _ := strings.Cut(v, "/")
		if err != nil || !strings.ContainsAny(first, ".:") && first != "localhost" || reference.Domain(named) != first ||
			strings.HasSuffix(v, "/") {
			return SnapshotRepositories{}, fmt.Errorf("snapshot repository %q: want host[:port][/prefix], e.g. registry.example.com:5000/sandman/e2b, under which each namespace's snapshots are <prefix>/<namespace>/<name>:<tag>", v)
		}
		host, port := splitRegistryHost(reference.Domain(named))
		s.repos = append(s.repos, snapshotRepo{name: v, host: host, port: port, path: strings.TrimSuffix(reference.Path(named), "x")})
	}
	// The deepest prefix decides (registry/sandman/e2b/<ns>/... is <ns>'s
	// even where registry/sandman is a repository too).
	slices.SortStableFunc(s.repos, func(a, b snapshotRepo) int { return cmp.Compare(len(b.path), len(a.path)) })
	return s, nil
}

// splitRegistryHost is a registry host[:port] in the form compared:
// lower case, without brackets, :443 as no port.
func splitRegistryHost(domain string) (host, port string) {
	domain = strings.ToLower(domain)
	host, port, err := net.SplitHostPort(domain)
	if err != nil {
		host, port = strings.Trim(domain, "[]"), ""
	}
	if port == "443" {
		port = ""
	}
	return host, port
}

// Empty says whether no repository is configured.
func (s SnapshotRepositories) Empty() bool { return len(s.repos) == 0 }

// Owner returns the namespace whose snapshot ref is, and the repository it
// is under; ok is false for an image under none of them (or not an image
// reference).
func (s SnapshotRepositories) Owner(ref string) (namespace, repository string, ok bool) {
	named, err := reference.ParseDockerRef(ref)
	if err != nil {
		return "", "", false
	}
	host, port := splitRegistryHost(reference.Domain(named))
	alias := host == "localhost" || net.ParseIP(host) != nil
	p := reference.Path(named)
	for _, r := range s.repos {
		if (host != r.host && !alias) || port != r.port || !strings.HasPrefix(p, r.path) {
			continue
		}
		ns, _, _ := strings.Cut(p[len(r.path):], "/")
		return ns, r.name, true
	}
	return "", "", false
}

// CheckStart says whether a pod of namespace may start ref: nil unless ref
// is another namespace's snapshot, which is an *Error of KindForbidden.
func (s SnapshotRepositories) CheckStart(ref, namespace string) error {
	owner, repo, ok := s.Owner(ref)
	if !ok || owner == namespace {
		return nil
	}
	name, err := Normalize(ref)
	if err != nil {
		name = ref
	}
	return &Error{Image: name, Kind: KindForbidden, Err: fmt.Errorf(
		"it is a snapshot of namespace %s; pods of namespace %s cannot start it: start one of namespace %s's snapshots (under %s/%s/)",
		owner, namespace, namespace, repo, namespace)}
}

// CheckWrite says whether a snapshot of a pod of namespace may be written
// as ref: with repositories configured, only under one of them, in the
// namespace's own place (<repository>/<namespace>/...). A refusal is
// errdefs.ErrInvalidArgument naming where to write it.
func (s SnapshotRepositories) CheckWrite(ref, namespace string) error {
	if s.Empty() {
		return nil
	}
	owner, repo, ok := s.Owner(ref)
	switch {
	case ok && owner == namespace:
		return nil
	case ok:
		return fmt.Errorf("snapshot image %s is under namespace %s's snapshots (%s/%s/): a snapshot of a pod of namespace %s goes under %s/%s/: %w",
			ref, owner, repo, owner, namespace, repo, namespace, errdefs.ErrInvalidArgument)
	}
	var where []string
	for _, r := range s.repos {
		where = append(where, r.name+"/"+namespace+"/")
	}
	return fmt.Errorf("snapshot image %s is outside this node's snapshot repositories: a snapshot of a pod of namespace %s goes under %s: %w",
		ref, namespace, strings.Join(where, " or "), errdefs.ErrInvalidArgument)
}

package kubeletauth

import (
	"net/http"
	"strings"

	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/authorization/authorizer"
)

// attributes are what a request asks of the node, as the kubelet's
// nodeAuthorizerAttributesGetter (pkg/kubelet/server/auth.go, Kubernetes
// 1.37) builds them: one per subresource to try, in order, differing only
// by subresource. Paths sandman serves besides the kubelet's
// (/sandman/v1/images, /sandman/v1/prepull, /sandman/v1/snapshot, /capacity,
// …) are proxy: get to read, create to pre-pull and snapshot.
func (a *Auth) attributes(u user.Info, r *http.Request) []authorizer.Attributes {
	path := r.URL.Path
	var subresources []string
	// KubeletFineGrainedAuthz (GA, locked on since 1.36): a finer
	// subresource first, proxy as the fallback.
	switch {
	case isSubpath(path, "/allocatedPods"), isSubpath(path, "/pods"), isSubpath(path, "/runningpods"):
		subresources = append(subresources, "pods")
	case isSubpath(path, "/healthz"):
		subresources = append(subresources, "healthz")
	case isSubpath(path, "/configz"):
		subresources = append(subresources, "configz")
	}
	switch {
	case isSubpath(path, "/stats"):
		subresources = append(subresources, "stats")
	case isSubpath(path, "/metrics"):
		subresources = append(subresources, "metrics")
	case isSubpath(path, "/logs"):
		// "log", as pods/log.
		subresources = append(subresources, "log")
	case isSubpath(path, "/checkpoint"):
		subresources = append(subresources, "checkpoint")
	case isSubpath(path, "/statusz"):
		subresources = append(subresources, "statusz")
	case isSubpath(path, "/flagz"):
		subresources = append(subresources, "configz")
	default:
		subresources = append(subresources, "proxy")
	}
	attrs := make([]authorizer.Attributes, 0, len(subresources))
	for _, sub := range subresources {
		attrs = append(attrs, authorizer.AttributesRecord{
			User:            u,
			Verb:            verb(r.Method),
			APIVersion:      "v1",
			Resource:        "nodes",
			Subresource:     sub,
			Name:            a.nodeName,
			ResourceRequest: true,
			Path:            path,
		})
	}
	return attrs
}

// verb is the API verb of an HTTP method, as the kubelet maps it; other
// methods have none, which no role grants.
func verb(method string) string {
	switch method {
	case http.MethodPost:
		return "create"
	case http.MethodGet:
		return "get"
	case http.MethodPut:
		return "update"
	case http.MethodPatch:
		return "patch"
	case http.MethodDelete:
		return "delete"
	}
	return ""
}

// isSubpath reports whether subpath is path or below it.
func isSubpath(subpath, path string) bool {
	path = strings.TrimSuffix(path, "/")
	return subpath == path || strings.HasPrefix(subpath, path) && subpath[len(path)] == '/'
}

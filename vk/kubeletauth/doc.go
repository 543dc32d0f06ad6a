// Package kubeletauth authenticates and authorizes every request to the
// virtual node's kubelet port as a kubelet does (kubelet's
// --authentication-token-webhook, --authorization-mode=Webhook and
// pkg/kubelet/server/auth.go):
//
//   - Authentication: a client certificate verified against the client CA
//     (user = CN, groups = O: the apiserver's kubelet client, metrics-server,
//     a user with a certificate), else a bearer token checked with a
//     TokenReview (authentication.k8s.io/v1), else anonymous when allowed.
//     A request that none of them authenticates gets 401.
//   - Authorization: a SubjectAccessReview (authorization.k8s.io/v1) for the
//     node: verb from the HTTP method (GET get, POST create, PUT update, PATCH
//     patch, DELETE delete), resource nodes, name = the virtual node,
//     subresource from the path — /stats → stats, /metrics → metrics, /logs →
//     log, /checkpoint → checkpoint, /statusz → statusz, /flagz → configz,
//     everything else (exec, attach, portForward, containerLogs, run,
//     sandman's own /sandman/v1/… and /capacity) → proxy; /pods,
//     /runningpods, /healthz and /configz try pods, healthz or configz first
//     and fall back to proxy (KubeletFineGrainedAuthz, GA in Kubernetes 1.36).
//     A refusal is 403 "Forbidden (user=…, verb=…, resource=nodes,
//     subresource(s)=[…])", as a kubelet answers.
//
// Both answers are cached (TokenReviews 2 min; allowed 5 min, refused 30 s),
// the kubelet's defaults, so a burst of kubectl exec costs one review. The
// authenticator and authorizer are k8s.io/apiserver's delegating ones, built
// as the kubelet builds them (cmd/kubelet/app/auth.go); virtual-kubelet's
// nodeutil.WebhookAuth wraps the same two but always enables TokenReview,
// checks a single subresource and answers a bare "Forbidden".
//
// RBAC the caller's identity needs: create on tokenreviews
// (authentication.k8s.io) and subjectaccessreviews (authorization.k8s.io),
// what the system:auth-delegator ClusterRole grants.
package kubeletauth

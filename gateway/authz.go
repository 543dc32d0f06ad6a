package gateway

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"

	"github.com/containerd/errdefs"
	corev1 "k8s.io/api/core/v1"

	"github.com/sandman-dev/sandman/podcontract"
)

// The authorization point: every route of the table (routes.go) is
// resolved here, once, to a verified tenant (a key's namespace) and, where
// the route names a sandbox, a sandbox the gateway can prove it made, or
// refused, before its handler runs; then it is charged to the tenant's
// budget. A tenant can create any pod, label and annotation in its own
// namespace, so nothing a pod says is taken on its word: a pod counts as
// a sandbox only when its token hash recovers from the gateway's token
// keys for its own namespace and ID (proven).

// authClass is how a route's caller is authorized.
type authClass int

const (
	// classNone: not declared. Never served (authorize panics at
	// start-up); TestRouteTableAttacks fails on it.
	classNone authClass = iota
	// classPublic: anyone; says nothing of any tenant (the gateway's own
	// health).
	classPublic
	// classKey: an API key; the call acts in the key's namespace only.
	classKey
	// classKeySandbox: an API key, and the path's {sandboxID} a proven,
	// live sandbox of the key's namespace (else 404, as for one that
	// does not exist).
	classKeySandbox
	// classUploadURL: a signed upload URL that serveFileUpload handed to
	// a key; the signature names the namespace it is charged to.
	classUploadURL
	// classDaemon: sandbox traffic carrying the sandbox's access token.
	classDaemon
	// classSigned: a signed file URL of a sandbox (its signature made
	// with the sandbox's access token).
	classSigned
	// classHealth: GET /health of a sandbox without a token. It learns
	// only whether the sandbox runs, and never resumes or extends one.
	classHealth
	// classPort: traffic to a sandbox's port: its traffic token, or
	// none when the sandbox allows public traffic.
	classPort
)

var classNames = map[authClass]string{
	classPublic: "public", classKey: "key", classKeySandbox: "key+sandbox", classUploadURL: "upload-url",
	classDaemon: "daemon-token", classSigned: "signed-url", classHealth: "health", classPort: "port-traffic",
}

func (c authClass) String() string {
	if s, ok := classNames[c]; ok {
		return s
	}
	return "class(" + strconv.Itoa(int(c)) + ")"
}

// proven says whether pod is sandbox id as this gateway made it: shaped as
// buildPod makes it, in a key's namespace, and carrying a token hash that
// recovers from the token keys for its own namespace and ID. Only the
// gateway holds those keys, so no tenant can make a pod pass for another
// namespace's sandbox, or for a sandbox of its own the gateway did not
// make.
func (g *Gateway) proven(pod *corev1.Pod, id string) bool {
	if !gatewayMade(pod, id) || !g.keys.hasNamespace(pod.Namespace) {
		return false
	}
	_, ok := g.cfg.Tokens.Recover(pod.Namespace, id, pod.Annotations[podcontract.AnnotationTokenSHA256])
	return ok
}

// authorize wraps a route's handler in its class's checks and its budget.
func (g *Gateway) authorize(rt route) http.Handler {
	if rt.class == classNone {
		panic("gateway: route " + rt.pattern + " has no authorization class")
	}
	if rt.serve == nil {
		panic("gateway: route " + rt.pattern + " has no handler")
	}
	if rt.class != classPublic && rt.budget == budgetNone {
		panic("gateway: route " + rt.pattern + " has no budget")
	}
	serve := rt.serve
	withKey := func(w http.ResponseWriter, r *http.Request, key Key) {
		release, err := g.budgets.take(key.Namespace, rt.budget, 1)
		if err != nil {
			writeError(w, err)
			return
		}
		defer release()
		serve(w, r, key)
	}
	switch rt.class {
	case classPublic:
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { serve(w, r, Key{}) })
	case classKey, classKeySandbox:
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			key, err := g.authenticate(r)
			if err != nil {
				writeError(w, err)
				return
			}
			if rt.class == classKeySandbox {
				if _, err := g.sandboxPod(r.Context(), key, r.PathValue("sandboxID")); err != nil {
					writeError(w, err)
					return
				}
			}
			// The body is read only for a caller who may call.
			g.readBody(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { withKey(w, r, key) })).ServeHTTP(w, r)
		})
	case classUploadURL:
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			ns, err := g.uploadURLNamespace(r)
			if err != nil {
				w.Header().Set("Connection", "close")
				writeError(w, err)
				return
			}
			withKey(w, r, Key{Namespace: ns})
		})
	}
	panic(fmt.Sprintf("gateway: route %s: authorization class %v is not one the control API serves", rt.pattern, rt.class))
}

// authenticate finds the caller's key, or says why not as E2B does (the SDK
// turns 401 into AuthenticationError: dist/index.js apiErrorFromCode).
func (g *Gateway) authenticate(r *http.Request) (Key, error) {
	if !g.Ready() {
		return Key{}, errorf(errdefs.ErrUnavailable, "the gateway is starting: retry in a moment")
	}
	raw := r.Header.Get(headerAPIKey)
	if raw == "" {
		return Key{}, errorf(errdefs.ErrUnauthenticated, "missing API key: send it in the X-API-Key header (E2B_API_KEY)")
	}
	key, ok := g.keys.lookup(raw)
	if !ok {
		return Key{}, errorf(errdefs.ErrUnauthenticated, "invalid API key")
	}
	return key, nil
}

// budgetName names one per-tenant budget.
type budgetName string

const (
	// budgetNone: the route holds nothing of a tenant's (classPublic
	// only).
	budgetNone budgetName = ""
	// budgetCalls: control calls in progress.
	budgetCalls budgetName = "calls"
	// budgetCreates: creates and forks in progress (each waits for its
	// pods to be ready).
	budgetCreates budgetName = "creates"
	// budgetLogReads: sandbox log reads in progress.
	budgetLogReads budgetName = "log-reads"
	// budgetBuilds: build start calls in progress; the builds running
	// are counted against Budgets.Builds when one starts (build.go).
	budgetBuilds budgetName = "build-starts"
	// budgetRunningBuilds: template builds running, on every replica.
	budgetRunningBuilds budgetName = "builds"
	// budgetUploads: uploads of template files in progress; their bytes
	// are charged to budgetUploadBytes as they arrive.
	budgetUploads budgetName = "uploads"
	// budgetUploadBytes: bytes of template files kept or arriving.
	budgetUploadBytes budgetName = "upload-bytes"
	// budgetUploadsKept: uploads kept in the registry store
	// (Budgets.UploadsKept), counted there, so on every replica.
	budgetUploadsKept budgetName = "uploads-kept"
	// budgetProxy: proxied sandbox requests (and the connections they
	// hold: streams, websockets) open to the tenant's sandboxes.
	budgetProxy budgetName = "proxy-connections"
)

// Budgets are the per-tenant limits of what the gateway holds for one
// namespace at once. Zero fields get the defaults in New.
type Budgets struct {
	// Calls: control calls in progress (default 256).
	Calls int64
	// Creates: creates and forks in progress (default 512).
	Creates int64
	// LogReads: sandbox log reads in progress (default 4).
	LogReads int64
	// Builds: template builds running at once, counted across replicas
	// (default 2); BuildStarts: start calls in progress (default 4).
	Builds      int64
	BuildStarts int64
	// Uploads: uploads of template files in progress (default 4);
	// UploadBytes: bytes of template files kept for builds, arriving
	// ones included (default 1 GiB).
	Uploads     int64
	UploadBytes int64
	// UploadsKept: uploads of template files kept in the registry store
	// (Config.UploadRepository) for builds not yet ended (default 16;
	// past it those older than an hour are removed first). With the
	// largest upload (Config.MaxUploadBytes) it bounds what one tenant
	// keeps in the registry.
	UploadsKept int64
	// ProxyConnections: sandbox requests in progress through the proxy
	// (default 1024).
	ProxyConnections int64
	// BuildLogBytes: what one build's kept logs may cost, each entry
	// charged its bytes plus logEntryCost (default 512 KiB: the build's
	// record is a ConfigMap, 1 MiB at most).
	BuildLogBytes int
}

func (b *Budgets) fill() {
	def := func(v *int64, d int64) {
		if *v <= 0 {
			*v = d
		}
	}
	def(&b.Calls, 256)
	def(&b.Creates, 512)
	def(&b.LogReads, 4)
	def(&b.Builds, 2)
	def(&b.BuildStarts, 4)
	def(&b.Uploads, 4)
	def(&b.UploadBytes, 1<<30)
	def(&b.UploadsKept, 16)
	def(&b.ProxyConnections, 1024)
	if b.BuildLogBytes <= 0 {
		b.BuildLogBytes = 512 << 10
	}
}

func (b *Budgets) limit(name budgetName) int64 {
	switch name {
	case budgetCalls:
		return b.Calls
	case budgetCreates:
		return b.Creates
	case budgetLogReads:
		return b.LogReads
	case budgetBuilds:
		return b.BuildStarts
	case budgetRunningBuilds:
		return b.Builds
	case budgetUploads:
		return b.Uploads
	case budgetUploadBytes:
		return b.UploadBytes
	case budgetUploadsKept:
		return b.UploadsKept
	case budgetProxy:
		return b.ProxyConnections
	}
	return 0
}

// budgets counts what each namespace holds against its Budgets.
type budgets struct {
	limits *Budgets
	// mu guards used: namespace → budget → amount held.
	mu   sync.Mutex
	used map[string]map[budgetName]int64
}

// take charges n to namespace's budget name, or refuses with 429 naming
// the budget. release gives it back (once; later calls do nothing).
func (b *budgets) take(namespace string, name budgetName, n int64) (release func(), err error) {
	if name == budgetNone {
		return func() {}, nil
	}
	limit := b.limits.limit(name)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.used == nil {
		b.used = map[string]map[budgetName]int64{}
	}
	u := b.used[namespace]
	if u == nil {
		u = map[budgetName]int64{}
		b.used[namespace] = u
	}
	if u[name]+n > limit {
		metricBudgetRefused.WithLabelValues(string(name)).Inc()
		return nil, budgetError(namespace, name, u[name], n, limit)
	}
	u[name] += n
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.used[namespace][name] -= n
			if b.used[namespace][name] == 0 {
				delete(b.used[namespace], name)
				if len(b.used[namespace]) == 0 {
					delete(b.used, namespace)
				}
			}
		})
	}, nil
}

// inUse is what namespace holds of budget name.
func (b *budgets) inUse(namespace string, name budgetName) int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used[namespace][name]
}

// budgetError is the 429 of a spent budget: which one, whose, and how
// much.
func budgetError(namespace string, name budgetName, used, asked, limit int64) error {
	unit := ""
	if name == budgetUploadBytes {
		unit = " bytes"
	}
	return errorf(errdefs.ErrResourceExhausted, "budget %q of namespace %s is spent: %d%s held, %d%s more asked, %d%s at most: retry when some end",
		name, namespace, used, unit, asked, unit, limit, unit)
}

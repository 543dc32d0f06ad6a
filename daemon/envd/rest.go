package envd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/sandman-dev/sandman/daemon/internal/sandboxuser"
)

// restRoutes adds envd's REST paths: /files, /health, /envs, /init,
// /metrics. As in envd, only /health answers without the access token.
func (s *Service) restRoutes(mux *http.ServeMux) {
	x := &restService{s: s}
	mux.HandleFunc("GET /health", x.health)
	mux.Handle("GET /files", s.filesAuthenticated(http.HandlerFunc(x.download)))
	mux.Handle("POST /files", s.filesAuthenticated(http.HandlerFunc(x.upload)))
	mux.Handle("GET /envs", s.authenticated(http.HandlerFunc(x.envs)))
	mux.Handle("POST /init", s.authenticated(http.HandlerFunc(x.postInit)))
	mux.Handle("GET /metrics", s.authenticated(http.HandlerFunc(x.metrics)))
}

// restService serves envd's REST paths.
type restService struct {
	s *Service

	// cpuMu guards cpuLast: the CPU sample of the previous /metrics, from
	// which the next one measures.
	cpuMu   sync.Mutex
	cpuLast *cpuSample
}

// filesAuthenticated is authenticated for /files, which E2B's SDKs
// also reach by signed URLs (uploadUrl, downloadUrl: signature= and
// signature_expiration= instead of X-Access-Token). A signature is a
// SHA-256 over the path, the user and the access token itself; the daemon
// keeps only a hash of the token, so it cannot check one, and refuses them
// saying so. sandman-gateway, which derives the token, checks them and
// forwards them with X-Access-Token (gateway/signed.go). A request that
// carries the token too is served by the token, as envd does.
func (s *Service) filesAuthenticated(h http.Handler) http.Handler {
	inner := s.authenticated(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("signature") != "" && s.sandbox.Assigned() && !s.authorized(r) {
			writeRESTError(w, http.StatusUnauthorized,
				"signed file URLs are checked by sandman-gateway, not by the sandbox: the daemon keeps only a hash of the access token, so it cannot check E2B's signatures; send the request through the gateway, or with the X-Access-Token header")
			return
		}
		inner.ServeHTTP(w, r)
	})
}

// writeRESTError writes envd's REST error: {"code": status, "message": …}.
func writeRESTError(w http.ResponseWriter, status int, format string, args ...any) {
	w.Header().Del("Content-Encoding")
	w.Header().Del("Content-Disposition")
	writeJSON(w, status, map[string]any{"code": status, "message": fmt.Sprintf(format, args...)})
}

// health answers 204, as envd does: the SDKs take any 2xx for a sandbox
// that runs (and a 502 from the proxy in front for one that does not).
func (x *restService) health(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusNoContent)
}

// envs answers the environment commands start with.
func (x *restService) envs(w http.ResponseWriter, r *http.Request) {
	out := map[string]string{}
	env, _ := x.s.sandbox.Environment()
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			out[k] = v
		}
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, out)
}

// initRequest is the body of POST /init (E2B's orchestrator sends it
// after a sandbox starts or resumes).
type initRequest struct {
	EnvVars        map[string]string `json:"envVars"`
	AccessToken    *string           `json:"accessToken"`
	Timestamp      *time.Time        `json:"timestamp"`
	DefaultUser    *string           `json:"defaultUser"`
	DefaultWorkdir *string           `json:"defaultWorkdir"`
	HyperloopIP    *string           `json:"hyperloopIP"`
	VolumeMounts   []json.RawMessage `json:"volumeMounts"`
}

// postInit takes what of POST /init the daemon can honour, all or nothing:
// envVars join the environment of later commands; defaultWorkdir becomes
// their working directory (and where relative paths start); an
// accessToken must be one the sandbox already accepts (the tokens are set
// by the node agent and never change here); timestamp is ignored (the
// sandbox runs on its node's clock, which the daemon can neither set nor
// needs to). defaultUser, hyperloopIP and volumeMounts cannot be honoured
// and are refused with a message.
func (x *restService) postInit(w http.ResponseWriter, r *http.Request) {
	var req initRequest
	body := http.MaxBytesReader(w, r.Body, x.s.cfg.MaxBodyBytes)
	if err := json.NewDecoder(body).Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		writeRESTError(w, http.StatusBadRequest, "malformed JSON body: %v", err)
		return
	}
	if req.AccessToken != nil && !x.s.sandbox.Accepts(*req.AccessToken) {
		writeRESTError(w, http.StatusConflict,
			"the access token is set when the sandbox is assigned (its envdAccessToken) and cannot be changed by /init")
		return
	}
	var refused []string
	if req.DefaultUser != nil && *req.DefaultUser != "" {
		refused = append(refused, "defaultUser (calls without a user run as the daemon's own user; name the user per call)")
	}
	if req.HyperloopIP != nil && *req.HyperloopIP != "" {
		refused = append(refused, "hyperloopIP")
	}
	if len(req.VolumeMounts) > 0 {
		refused = append(refused, "volumeMounts (mount volumes through the pod spec)")
	}
	if len(refused) > 0 {
		writeRESTError(w, http.StatusBadRequest, "this sandbox cannot honour %s; nothing was changed", strings.Join(refused, ", "))
		return
	}
	dir := ""
	if req.DefaultWorkdir != nil && *req.DefaultWorkdir != "" {
		dir = filepath.Clean(*req.DefaultWorkdir)
		if fi, err := os.Stat(dir); !filepath.IsAbs(dir) || err != nil || !fi.IsDir() {
			writeRESTError(w, http.StatusBadRequest, "defaultWorkdir %q is not an existing directory given by an absolute path; nothing was changed", *req.DefaultWorkdir)
			return
		}
	}
	for k := range req.EnvVars {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			writeRESTError(w, http.StatusBadRequest, "environment variable name %q is not valid; nothing was changed", k)
			return
		}
	}
	x.s.sandbox.Init(req.EnvVars, dir)
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusNoContent)
}

// restUser is the user of a /files call: the username parameter, else the
// HTTP Basic user.
func (x *restService) restUser(w http.ResponseWriter, r *http.Request) (*sandboxuser.User, bool) {
	name := callUser(r.Context())
	if q := r.URL.Query(); q.Has("username") {
		name = q.Get("username")
	}
	u, err := x.s.userFor(name)
	if err != nil {
		writeRESTError(w, http.StatusUnauthorized, "%v", err)
		return u, false
	}
	return u, true
}

// errorText is err's message without a Connect code prefix.
func errorText(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}

package daemon

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"strings"

	"connectrpc.com/connect"

	"github.com/sandman-dev/sandman/daemon/envd/spec/filesystem/filesystemconnect"
	"github.com/sandman-dev/sandman/daemon/envd/spec/process/processconnect"
)

// envd is E2B's in-sandbox agent. The daemon speaks its protocol on its own
// port beside the v1 API, so that trainers written against E2B's SDKs run
// unchanged (through sandman-gateway): the Connect-RPC process and
// filesystem services, and the REST paths /files, /health, /envs, /init and
// /metrics.

// EnvdVersion is the envd version the daemon reports. The SDKs turn
// features on by it, so it names the newest version whose features the
// daemon implements (see docs/e2b.md).
const EnvdVersion = "0.5.7"

// envdUserKey carries the user a call asks to act as (HTTP Basic auth's
// user name, as the SDKs send it; "" for the sandbox's default user).
type envdUserKey struct{}

// envdUser is the user an envd call runs as ("" for the default).
func envdUser(ctx context.Context) string {
	u, _ := ctx.Value(envdUserKey{}).(string)
	return u
}

// envdRoutes adds envd's services to mux.
func (s *Server) envdRoutes(mux *http.ServeMux) {
	opts := []connect.HandlerOption{connect.WithReadMaxBytes(int(s.cfg.MaxBodyBytes))}
	path, h := processconnect.NewProcessHandler(&envdProcess{s: s}, opts...)
	mux.Handle(path, s.envdAuthenticated(h))
	path, h = filesystemconnect.NewFilesystemHandler(&envdFilesystem{s: s}, opts...)
	mux.Handle(path, s.envdAuthenticated(h))
	s.envdRESTRoutes(mux)
}

// envdAuthenticated checks envd's access token (header X-Access-Token, as
// the SDKs send it; a v1 bearer token is accepted too) against the
// sandbox's token hashes, and records the call as activity.
func (s *Server) envdAuthenticated(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.access.Load().assigned {
			writeEnvdError(w, r, http.StatusServiceUnavailable, "this sandbox is not assigned to a pod yet")
			return
		}
		if !s.envdAuthorized(r) {
			writeEnvdError(w, r, http.StatusUnauthorized, "missing or wrong access token: send X-Access-Token with the sandbox's envdAccessToken")
			return
		}
		user := ""
		if u, _, ok := basicUser(r); ok {
			user = u
		}
		s.touch()
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), envdUserKey{}, user)))
	})
}

func (s *Server) envdAuthorized(r *http.Request) bool {
	a := s.access.Load()
	if a.allowUnauth {
		return true
	}
	tok := r.Header.Get("X-Access-Token")
	if tok == "" {
		tok, _ = strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	}
	return tok != "" && a.accepts(tok)
}

// basicUser is the user name of an "Authorization: Basic" header (the
// SDKs send "user:" with no password).
func basicUser(r *http.Request) (string, string, bool) {
	v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Basic ")
	if !ok {
		return "", "", false
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(v))
	if err != nil {
		return "", "", false
	}
	u, p, _ := strings.Cut(string(b), ":")
	return u, p, true
}

// writeEnvdError answers an envd call that failed before its handler ran:
// as a Connect error (in the protocol and codec of the request) for the RPC
// services, as envd's JSON error for REST.
func writeEnvdError(w http.ResponseWriter, r *http.Request, status int, msg string) {
	if connectErrors.IsSupported(r) {
		code := connect.CodeUnauthenticated
		if status == http.StatusServiceUnavailable {
			code = connect.CodeUnavailable
		}
		_ = connectErrors.Write(w, r, connect.NewError(code, errors.New(msg)))
		return
	}
	writeJSON(w, status, map[string]any{"code": status, "message": msg})
}

// connectErrors tells RPCs from REST calls by Connect-Protocol-Version (the
// Connect clients send it; without the requirement, every GET and every
// JSON POST, such as GET /files or POST /init, would pass for a Connect
// call and get a Connect error instead of envd's JSON one).
var connectErrors = connect.NewErrorWriter(connect.WithRequireConnectProtocolHeader())

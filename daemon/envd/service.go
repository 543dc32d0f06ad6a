// Package envd serves E2B's in-sandbox agent protocol, so that trainers
// written against E2B's SDKs run unchanged (through sandman-gateway): the
// Connect-RPC process and filesystem services (a file per RPC family:
// process_start.go, filesystem_move.go, …) and the REST paths (rest*.go).
// It shares the daemon's port, its mux and its process core with the v1
// API; what it needs of the daemon around it is Sandbox.
package envd

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"os/exec"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/sandman-dev/sandman/daemon/envd/spec/filesystem/filesystemconnect"
	"github.com/sandman-dev/sandman/daemon/envd/spec/process/processconnect"
	"github.com/sandman-dev/sandman/daemon/internal/process"
)

// Version is the envd version the daemon reports. The SDKs turn features
// on by it, so it names the newest version whose features the daemon
// implements (see docs/e2b.md): up to file metadata (0.6.2), watch entry
// info (0.6.3) and watches on network mounts (0.6.4), the newest any SDK
// (JavaScript and Python, 2.51) checks for. The gateway reports the same
// (gateway.EnvdVersion).
const Version = "0.6.4"

// Sandbox is what the envd services need of the daemon around them.
type Sandbox interface {
	// Assigned reports whether the sandbox is assigned to a pod (no call
	// is served before).
	Assigned() bool
	// Authorized reports whether token lets a call in: one of the
	// sandbox's tokens, or any when the sandbox takes calls without one.
	Authorized(token string) bool
	// Accepts reports whether token is one of the sandbox's tokens.
	Accepts(token string) bool
	// Environment is the environment and working directory commands
	// start with.
	Environment() (env []string, dir string)
	// Init sets env over the environment and, unless "", makes dir the
	// working directory.
	Init(env map[string]string, dir string)
	// Call records a call's start as activity; done records its end.
	Call() (done func())
	// Command builds the command that runs argv with env over the
	// sandbox's environment in cwd, in a process group of its own. Its
	// errors carry the v1 API's code (see apiCoded).
	Command(argv []string, env map[string]string, cwd string) (*exec.Cmd, error)
}

// Config configures a Service. Every field is required.
type Config struct {
	Sandbox Sandbox
	// Procs is the daemon's process core: envd's processes share its
	// table, slots and process groups with the v1 API's.
	Procs *process.Manager
	Log   *slog.Logger
	// Now is the clock.
	Now func() time.Time
	// MaxBodyBytes caps an RPC message and a JSON body.
	MaxBodyBytes int64
	// MaxUploadBytes caps one upload (0: no cap but the disk).
	MaxUploadBytes int64
}

// Service serves envd's protocols.
type Service struct {
	cfg     Config
	sandbox Sandbox
	procs   *process.Manager
	log     *slog.Logger
}

// New returns a Service for cfg.
func New(cfg Config) *Service {
	return &Service{cfg: cfg, sandbox: cfg.Sandbox, procs: cfg.Procs, log: cfg.Log}
}

// userKey carries the user a call asks to act as (HTTP Basic auth's
// user name, as the SDKs send it; "" for the sandbox's default user).
type userKey struct{}

// callUser is the user an envd call runs as ("" for the default).
func callUser(ctx context.Context) string {
	u, _ := ctx.Value(userKey{}).(string)
	return u
}

// Routes adds envd's services to mux, beside the v1 API on the daemon's
// one port: the Connect-RPC process and filesystem services, and the REST
// paths /files, /health, /envs, /init and /metrics.
func (s *Service) Routes(mux *http.ServeMux) {
	opts := []connect.HandlerOption{connect.WithReadMaxBytes(int(s.cfg.MaxBodyBytes))}
	path, h := processconnect.NewProcessHandler(&processService{s: s}, opts...)
	mux.Handle(path, s.authenticated(h))
	path, h = filesystemconnect.NewFilesystemHandler(&filesystemService{s: s}, opts...)
	mux.Handle(path, s.authenticated(h))
	s.restRoutes(mux)
}

// authenticated checks envd's access token (header X-Access-Token, as
// the SDKs send it; a v1 bearer token is accepted too) against the
// sandbox's token hashes, and records the call as activity.
func (s *Service) authenticated(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.sandbox.Assigned() {
			writeError(w, r, http.StatusServiceUnavailable, "this sandbox is not assigned to a pod yet")
			return
		}
		if !s.authorized(r) {
			writeError(w, r, http.StatusUnauthorized, "missing or wrong access token: send X-Access-Token with the sandbox's envdAccessToken")
			return
		}
		user := ""
		if u, _, ok := basicUser(r); ok {
			user = u
		}
		defer s.sandbox.Call()()
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
	})
}

func (s *Service) authorized(r *http.Request) bool {
	tok := r.Header.Get("X-Access-Token")
	if tok == "" {
		tok, _ = strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	}
	return s.sandbox.Authorized(tok)
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

// writeError answers an envd call that failed before its handler ran:
// as a Connect error (in the protocol and codec of the request) for the RPC
// services, as envd's JSON error for REST.
func writeError(w http.ResponseWriter, r *http.Request, status int, msg string) {
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

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// noDeadline lifts the server's read or write deadline for long transfers.
var noDeadline time.Time

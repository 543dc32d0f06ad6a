package daemon

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/internal/process"
)

// Config configures a Server. Zero values take the defaults noted.
type Config struct {
	// TokenHashes are the SHA-256 digests of the accepted bearer tokens.
	TokenHashes [][sha256.Size]byte
	// AllowUnauthenticated accepts calls without a token (local experiments).
	AllowUnauthenticated bool
	// AssignTokenHash, when set, starts the daemon unassigned (a hot slot):
	// it answers health, and POST /v1/assign from the holder of this token
	// (the node agent) sets the tokens, environment and main process. Until
	// then every other call gets 503. Once assigned, the holder may
	// re-assign its tokens (a fork's: see assign).
	AssignTokenHash *[sha256.Size]byte

	// Env is the sandbox's environment for commands (default os.Environ()).
	Env []string
	// Dir is the default working directory (default: the daemon's own).
	Dir string
	// StateDir holds session command files (default /tmp/.sandman).
	StateDir string

	// MaxProcesses caps execs, background processes and sessions alive at
	// once (default 256).
	MaxProcesses int
	// MaxBodyBytes caps JSON request bodies (default 16 MiB).
	MaxBodyBytes int64
	// MaxOutputBytes is the default cap on an exec's stdout and stderr each
	// (default 16 MiB).
	MaxOutputBytes int64
	// ProcessOutputBytes is how much output a background process retains for
	// re-attach (default 4 MiB).
	ProcessOutputBytes int
	// MaxUploadBytes caps one file upload (default 0: no cap but the disk).
	MaxUploadBytes int64
	// KillGrace is how long a TERM'd process group gets before KILL
	// (default 2 s).
	KillGrace time.Duration
	// RestartPolicy is the main process's, as a pod's: Never (default: the
	// sandbox ends with it), OnFailure (restarted after a non-zero exit) or
	// Always. Restarts back off from 1 s, doubling to 5 min.
	RestartPolicy string

	// StopSignals end Supervise as a pod stop does (default SIGTERM and
	// SIGINT; as PID 1 of a sandbox, SIGTERM only).
	StopSignals []os.Signal
	// MaxConnsPerClient bounds the connections one client address holds
	// open at once (default 256): one sandbox cannot exhaust another's
	// daemon. Clients over it get 429 and the connection is closed.
	MaxConnsPerClient int

	Version string
	Logger  *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
	// Reaper collects exit statuses; with ReapAll it reaps every child, as
	// PID 1 must. Default: one that waits for its own children only.
	Reaper *Reaper
}

// Server serves the daemon API. Create it with New.
type Server struct {
	cfg     Config
	log     *slog.Logger
	handler http.Handler

	// lastActivity is the unix-nano time of the last authenticated call
	// (its start and its end); calls counts those in progress.
	lastActivity atomic.Int64
	calls        atomic.Int32

	// procs starts, tracks and stops every child: execs, background
	// processes (v1's and envd's, one table), sessions, attaches.
	procs    *process.Manager
	sessions *sessionTable

	// access is who may call and with which environment commands run; an
	// assignment replaces it.
	access atomic.Pointer[access]
	// assignMain receives the main command of an assignment (Supervise
	// starts it).
	assignMain chan mainSpec
	// mainRestarts counts restarts of the main process.
	mainRestarts atomic.Int64
}

// Reaper collects the exit statuses of the daemon's children (see
// NewReaper).
type Reaper = process.Reaper

// NewReaper returns a Reaper. reapAll is for PID 1 (or a child subreaper):
// it reaps every child on SIGCHLD; otherwise each child is waited for alone.
func NewReaper(reapAll bool) *Reaper { return process.NewReaper(reapAll) }

// New checks cfg, fills defaults and returns a Server.
func New(cfg Config) (*Server, error) {
	if len(cfg.TokenHashes) == 0 && !cfg.AllowUnauthenticated && cfg.AssignTokenHash == nil {
		return nil, errors.New("no token hash configured: pass --token-sha256 (or --allow-unauthenticated for local experiments)")
	}
	if err := checkRestartPolicy(cfg.RestartPolicy); err != nil {
		return nil, err
	}
	if cfg.Env == nil {
		cfg.Env = os.Environ()
	}
	if cfg.Dir == "" {
		d, err := os.Getwd()
		if err != nil {
			d = "/"
		}
		cfg.Dir = d
	}
	if cfg.StateDir == "" {
		cfg.StateDir = "/tmp/.sandman"
	}
	if cfg.MaxProcesses <= 0 {
		cfg.MaxProcesses = 256
	}
	if len(cfg.StopSignals) == 0 {
		cfg.StopSignals = []os.Signal{syscall.SIGTERM, syscall.SIGINT}
	}
	if cfg.MaxConnsPerClient <= 0 {
		cfg.MaxConnsPerClient = 256
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 16 << 20
	}
	if cfg.MaxOutputBytes <= 0 {
		cfg.MaxOutputBytes = 16 << 20
	}
	if cfg.ProcessOutputBytes <= 0 {
		cfg.ProcessOutputBytes = 4 << 20
	}
	if cfg.KillGrace <= 0 {
		cfg.KillGrace = 2 * time.Second
	}
	if cfg.Version == "" {
		cfg.Version = "dev"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Reaper == nil {
		cfg.Reaper = NewReaper(false)
	}
	s := &Server{
		cfg: cfg,
		log: cfg.Logger,
		procs: process.New(process.Config{
			Reaper: cfg.Reaper, MaxProcesses: cfg.MaxProcesses, OutputBytes: cfg.ProcessOutputBytes,
			KillGrace: cfg.KillGrace, Now: cfg.Now,
		}),
	}
	s.access.Store(&access{
		hashes: cfg.TokenHashes, allowUnauth: cfg.AllowUnauthenticated, env: cfg.Env, dir: cfg.Dir,
		assigned: cfg.AssignTokenHash == nil, assignHash: cfg.AssignTokenHash,
	})
	s.assignMain = make(chan mainSpec, 1)
	s.sessions = newSessionTable()
	s.lastActivity.Store(cfg.Now().UnixNano())
	s.handler = s.routes()
	return s, nil
}

// ParseTokenHash decodes a hex SHA-256 digest as given to --token-sha256.
func ParseTokenHash(h string) ([sha256.Size]byte, error) {
	var out [sha256.Size]byte
	b, err := hex.DecodeString(strings.TrimSpace(h))
	if err != nil || len(b) != sha256.Size {
		return out, fmt.Errorf("token hash %q: want 64 hex digits (the SHA-256 of the token)", h)
	}
	copy(out[:], b)
	return out, nil
}

// Handler is the HTTP handler of the API.
func (s *Server) Handler() http.Handler { return s.handler }

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/health", s.health)
	auth := func(pattern string, h http.HandlerFunc) { mux.Handle(pattern, s.authenticated(h)) }
	mux.HandleFunc("POST /v1/assign", s.assign)
	auth("POST /v1/renew", s.renew)
	// Replacing a token is not activity: the control plane re-keys idle
	// sandboxes without keeping them alive.
	mux.Handle("POST /v1/token", s.checkToken(s.rotateToken))
	auth("POST /v1/exec", s.exec)
	auth("POST /v1/processes", s.startProcess)
	auth("GET /v1/processes", s.listProcesses)
	auth("GET /v1/processes/{id}", s.getProcess)
	auth("GET /v1/processes/{id}/output", s.processOutput)
	auth("POST /v1/processes/{id}/stdin", s.processStdin)
	auth("POST /v1/processes/{id}/signal", s.signalProcess)
	auth("DELETE /v1/processes/{id}", s.deleteProcess)
	auth("POST /v1/sessions", s.createSession)
	auth("GET /v1/sessions", s.listSessions)
	auth("POST /v1/sessions/{id}/run", s.runSession)
	auth("POST /v1/sessions/{id}/interrupt", s.interruptSession)
	auth("DELETE /v1/sessions/{id}", s.deleteSession)
	auth("GET /v1/files", s.readFile)
	auth("PUT /v1/files", s.writeFile)
	auth("DELETE /v1/files", s.deleteFile)
	auth("GET /v1/files/stat", s.statFile)
	auth("GET /v1/files/list", s.listFiles)
	auth("POST /v1/files/move", s.moveFile)
	auth("POST /v1/files/mkdir", s.mkdir)
	auth("GET /v1/attach", s.attach)
	s.envdRoutes(mux)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, errf(http.StatusNotFound, api.CodeNotFound, "no such endpoint: %s %s", r.Method, r.URL.Path))
	})
	return s.recoverPanics(mux)
}

// recoverPanics turns a panicking handler into a logged 500 and keeps the
// connection's server alive.
func (s *Server) recoverPanics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			v := recover()
			if v == nil || v == http.ErrAbortHandler {
				if v != nil {
					panic(v)
				}
				return
			}
			s.log.Error("handler panic", "method", r.Method, "path", r.URL.Path, "panic", v, "stack", string(debug.Stack()))
			writeError(w, errf(http.StatusInternalServerError, api.CodeInternal, "internal error: %v", v))
		}()
		next.ServeHTTP(w, r)
	})
}

// authenticated checks the bearer token and records the call as activity.
func (s *Server) authenticated(h http.HandlerFunc) http.Handler {
	return s.checkToken(func(w http.ResponseWriter, r *http.Request) {
		defer s.call()()
		h(w, r)
	})
}

// checkToken checks the bearer token; the call is not activity.
func (s *Server) checkToken(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.access.Load().assigned {
			writeError(w, errf(http.StatusServiceUnavailable, api.CodeUnavailable, "this sandbox is not assigned to a pod yet"))
			return
		}
		if !s.authorized(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sandman"`)
			writeError(w, errf(http.StatusUnauthorized, api.CodeUnauthorized,
				"missing or wrong bearer token: send Authorization: Bearer <token> with the sandbox's token"))
			return
		}
		h(w, r)
	})
}

func (s *Server) authorized(r *http.Request) bool {
	a := s.access.Load()
	if a.allowUnauth {
		return true
	}
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		// Browsers and WebSocket clients cannot always set headers.
		if r.URL.Path != "/v1/attach" {
			return false
		}
		tok = r.URL.Query().Get("access_token")
		if tok == "" {
			return false
		}
	}
	return a.accepts(tok)
}

func (s *Server) touch() { s.lastActivity.Store(s.cfg.Now().UnixNano()) }

// call records an authenticated call's start as activity and counts it in
// progress until done is called, which records its end too.
func (s *Server) call() (done func()) {
	s.touch()
	s.calls.Add(1)
	return func() {
		s.calls.Add(-1)
		s.touch()
	}
}

// CallIdleSeconds is the time since the last authenticated call ended, or
// 0 while one is in progress, whatever the sandbox's processes do.
func (s *Server) CallIdleSeconds() float64 {
	if s.calls.Load() > 0 {
		return 0
	}
	d := s.cfg.Now().Sub(time.Unix(0, s.lastActivity.Load()))
	return max(d.Seconds(), 0)
}

// IdleSeconds is the time since the last authenticated call, or 0 while an
// exec, background process or session run is in progress.
func (s *Server) IdleSeconds() float64 {
	if s.procs.Running() > 0 {
		return 0
	}
	d := s.cfg.Now().Sub(time.Unix(0, s.lastActivity.Load()))
	return max(d.Seconds(), 0)
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	status := "ok"
	if !s.access.Load().assigned {
		status = "waiting"
	}
	if !s.access.Load().assigned || !s.authorized(r) {
		// Without the sandbox's token, health says only whether the daemon
		// is up: not its version, its activity or its processes.
		writeJSON(w, http.StatusOK, map[string]string{"status": status})
		return
	}
	writeJSON(w, http.StatusOK, api.Health{
		Status: status, Version: s.cfg.Version, IdleSeconds: s.IdleSeconds(), CallIdleSeconds: s.CallIdleSeconds(), Running: s.procs.Running(),
		MainRestarts: int(s.mainRestarts.Load()),
	})
}

// renew is an explicit keep-alive: the call itself counts as activity.
func (s *Server) renew(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, api.Health{
		Status: "ok", Version: s.cfg.Version, IdleSeconds: s.IdleSeconds(), CallIdleSeconds: s.CallIdleSeconds(), Running: s.procs.Running(),
	})
}

// Shutdown refuses new work, sends TERM to every process group the server
// started, and KILLs what is left when ctx ends; it returns once the groups
// are gone (or, should a KILLed process hang in the kernel, 2 s after the
// KILL), so that nothing it started outlives a daemon that has stopped.
func (s *Server) Shutdown(ctx context.Context) { s.procs.Shutdown(ctx) }

// Serve serves the API on l until ctx ends.
func (s *Server) Serve(ctx context.Context, l net.Listener) error {
	hs := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       5 * time.Minute,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	if _, tcp := l.Addr().(*net.TCPAddr); tcp {
		l = newClientLimit(l, s.cfg.MaxConnsPerClient, s.log)
	}
	if err := hs.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// apiError is an error with its HTTP status and API code.
type apiError struct {
	status int
	code   string
	msg    string
}

func (e *apiError) Error() string { return e.msg }

// APICode is the error's v1 API code (the envd services translate it).
func (e *apiError) APICode() string { return e.code }

func errf(status int, code, format string, args ...any) error {
	return &apiError{status: status, code: code, msg: fmt.Sprintf(format, args...)}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, err error) {
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = classify(err)
	}
	writeJSON(w, ae.status, api.ErrorBody{Error: api.Error{Code: ae.code, Message: ae.msg}})
}

// decode reads a JSON body of at most the configured size into v.
func (s *Server) decode(w http.ResponseWriter, r *http.Request, v any) error {
	// A JSON body must arrive promptly; a stalled client cannot hold a
	// handler (uploads and streams lift their deadlines themselves).
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(30 * time.Second))
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return errf(http.StatusRequestEntityTooLarge, api.CodeTooLarge,
				"request body over %d bytes: send large inputs as files (PUT /v1/files)", mbe.Limit)
		case errors.Is(err, io.EOF):
			return errf(http.StatusBadRequest, api.CodeBadRequest, "empty request body: want a JSON object")
		default:
			return errf(http.StatusBadRequest, api.CodeBadRequest, "malformed JSON body: %v", err)
		}
	}
	if dec.More() {
		return errf(http.StatusBadRequest, api.CodeBadRequest, "malformed JSON body: more than one JSON value")
	}
	return nil
}

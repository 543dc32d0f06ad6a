package daemon

import (
	"net/http"
	"os/exec"

	"github.com/sandman-dev/sandman/daemon/envd"
)

// envdRoutes adds E2B's envd protocol (package envd) to the mux of the v1
// API: one port, one process core, one set of tokens.
func (s *Server) envdRoutes(mux *http.ServeMux) {
	envd.New(envd.Config{
		Sandbox: envdSandbox{s}, Procs: s.procs, Log: s.log, Now: s.cfg.Now,
		MaxBodyBytes: s.cfg.MaxBodyBytes, MaxUploadBytes: s.cfg.MaxUploadBytes,
	}).Routes(mux)
}

// envdSandbox is the Server as the envd services see it.
type envdSandbox struct{ s *Server }

var _ envd.Sandbox = envdSandbox{}

func (e envdSandbox) Assigned() bool { return e.s.access.Load().assigned }

func (e envdSandbox) Authorized(token string) bool {
	a := e.s.access.Load()
	return a.allowUnauth || token != "" && a.accepts(token)
}

func (e envdSandbox) Accepts(token string) bool { return e.s.access.Load().accepts(token) }

func (e envdSandbox) Environment() ([]string, string) {
	a := e.s.access.Load()
	return a.env, a.dir
}

// Init sets env over the environment of later commands and, unless "",
// makes dir their working directory (compare-and-swap, as an assignment
// or a token rotation may replace the access meanwhile).
func (e envdSandbox) Init(env map[string]string, dir string) {
	for {
		old := e.s.access.Load()
		next := *old
		next.env = mergeEnv(old.env, env)
		if dir != "" {
			next.dir = dir
		}
		if e.s.access.CompareAndSwap(old, &next) {
			return
		}
	}
}

func (e envdSandbox) Call() (done func()) { return e.s.call() }

func (e envdSandbox) Command(argv []string, env map[string]string, cwd string) (*exec.Cmd, error) {
	return e.s.command(commandSpec{argv: argv, env: env, cwd: cwd})
}

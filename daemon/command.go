package daemon

import (
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/internal/sandboxuser"
)

// commandSpec is what every way of starting a process has in common.
type commandSpec struct {
	argv      []string
	shell     string
	shellPath string
	env       map[string]string
	cwd       string
}

// command builds the exec.Cmd for spec: argv looked up in the merged
// environment's PATH, or a command line for the image's shell; its own
// process group; the sandbox's environment with spec.env merged over it.
func (s *Server) command(spec commandSpec) (*exec.Cmd, error) {
	a := s.access.Load()
	env := mergeEnv(a.env, spec.env)
	argv := spec.argv
	switch {
	case len(argv) > 0 && spec.shell != "":
		return nil, errf(http.StatusBadRequest, api.CodeBadRequest, "give either cmd (an argv) or shell (a command line), not both")
	case spec.shell != "":
		sh, err := s.shellPath(spec.shellPath)
		if err != nil {
			return nil, err
		}
		argv = []string{sh, "-c", spec.shell}
	case len(argv) == 0 || argv[0] == "":
		return nil, errf(http.StatusBadRequest, api.CodeBadRequest, "nothing to run: give cmd (an argv) or shell (a command line)")
	}
	path, err := lookPath(argv[0], env)
	if err != nil {
		return nil, err
	}
	dir := spec.cwd
	if dir == "" {
		dir = a.dir
	}
	if !filepath.IsAbs(dir) {
		return nil, errf(http.StatusBadRequest, api.CodeBadRequest, "cwd %q is not an absolute path", dir)
	}
	if fi, err := os.Stat(dir); err != nil {
		return nil, errf(http.StatusBadRequest, api.CodeNotFound, "working directory %s: %v", dir, unwrapPathErr(err))
	} else if !fi.IsDir() {
		return nil, errf(http.StatusBadRequest, api.CodeNotADirectory, "working directory %s is not a directory", dir)
	}
	return &exec.Cmd{
		Path:        path,
		Args:        argv,
		Env:         env,
		Dir:         dir,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true},
	}, nil
}

// shellPath picks the shell for command lines and sessions.
func (s *Server) shellPath(explicit string) (string, error) {
	if explicit != "" {
		if !filepath.IsAbs(explicit) {
			return "", errf(http.StatusBadRequest, api.CodeBadRequest, "shell_path %q is not an absolute path", explicit)
		}
		if _, err := os.Stat(explicit); err != nil {
			return "", errf(http.StatusUnprocessableEntity, api.CodeNoShell, "shell %s not found in this image", explicit)
		}
		return explicit, nil
	}
	for _, sh := range []string{"/bin/bash", "/bin/sh"} {
		if fi, err := os.Stat(sh); err == nil && !fi.IsDir() {
			return sh, nil
		}
	}
	return "", errf(http.StatusUnprocessableEntity, api.CodeNoShell,
		"this image has no shell (neither /bin/bash nor /bin/sh exists): send the command as an argv in cmd")
}

// lookPath finds file in the PATH of env, as execvp would.
func lookPath(file string, env []string) (string, error) {
	if strings.Contains(file, "/") {
		if err := executable(file); err != nil {
			return "", errf(http.StatusNotFound, api.CodeNotFound, "cannot run %s: %v", file, unwrapPathErr(err))
		}
		return file, nil
	}
	pathEnv, ok := sandboxuser.LookupEnv(env, "PATH")
	if !ok {
		pathEnv = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	}
	for _, dir := range filepath.SplitList(pathEnv) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, file)
		if executable(p) == nil {
			return p, nil
		}
	}
	return "", errf(http.StatusNotFound, api.CodeNotFound, "executable %q not found in PATH (%s)", file, pathEnv)
}

func executable(p string) error {
	fi, err := os.Stat(p)
	if err != nil {
		return err
	}
	if fi.IsDir() {
		return syscall.EISDIR
	}
	if fi.Mode().Perm()&0o111 == 0 {
		return os.ErrPermission
	}
	return nil
}

func unwrapPathErr(err error) error {
	if pe, ok := err.(*os.PathError); ok {
		return pe.Err
	}
	return err
}

// mergeEnv returns base with extra set over it; later keys win.
func mergeEnv(base []string, extra map[string]string) []string {
	if len(extra) == 0 {
		return base
	}
	out := make([]string, 0, len(base)+len(extra))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := extra[k]; !ok {
			out = append(out, kv)
		}
	}
	for k, v := range extra {
		out = append(out, k+"="+v)
	}
	return out
}

package daemon

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/internal/sandboxuser"
	"golang.org/x/sys/unix"
)

const (
	sigTERM = syscall.SIGTERM
	sigKILL = syscall.SIGKILL
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

// proc is a started child with its own process group.
type proc struct {
	pid    int
	exit   <-chan exitStatus
	stdout *os.File
	stderr *os.File
	stdin  *os.File // nil unless asked for
	start  time.Time
}

// spawn starts cmd with pipes for stdout and stderr, and for stdin when
// withStdin (otherwise stdin is /dev/null), and records its process group.
func (s *Server) spawn(cmd *exec.Cmd, withStdin bool) (p *proc, retErr error) {
	var toClose []*os.File
	defer func() {
		for _, f := range toClose {
			f.Close()
		}
	}()
	outR, outW, err := childPipe(false)
	if err != nil {
		return nil, err
	}
	errR, errW, err := childPipe(false)
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, err
	}
	toClose = append(toClose, outW, errW)
	defer func() {
		if retErr != nil {
			outR.Close()
			errR.Close()
		}
	}()
	var inW *os.File
	if withStdin {
		w, inR, err := childPipe(true)
		if err != nil {
			return nil, err
		}
		toClose = append(toClose, inR)
		cmd.Stdin, inW = inR, w
	} else if null, err := devNull(); err == nil {
		cmd.Stdin = null // shared, never closed
	} else {
		// No /dev/null in this image: an empty, closed pipe reads as EOF too.
		inR, w, err := os.Pipe()
		if err != nil {
			return nil, err
		}
		w.Close()
		toClose = append(toClose, inR)
		cmd.Stdin = inR
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	pid, exit, err := s.reaper.Start(cmd)
	if err != nil {
		if inW != nil {
			inW.Close()
		}
		return nil, classifyStart(cmd, err)
	}
	s.addGroup(pid)
	return &proc{pid: pid, exit: exit, stdout: outR, stderr: errR, stdin: inW, start: time.Now()}, nil
}

// childPipe returns a pipe between the daemon and a child: the daemon's end
// non-blocking, in Go's netpoller, the child's end blocking, as os.Pipe and
// exec would leave them but in half the system calls (os.Pipe makes both
// ends non-blocking and exec makes the child's blocking again). The child
// reads from it when toChild, else writes to it.
func childPipe(toChild bool) (ours, theirs *os.File, err error) {
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, nil, os.NewSyscallError("pipe2", err)
	}
	o, t := p[0], p[1]
	if toChild {
		o, t = t, o // ours is the write end
	}
	// O_NONBLOCK is the only status flag a pipe end has: clear it on theirs.
	if _, err := unix.FcntlInt(uintptr(t), unix.F_SETFL, 0); err != nil {
		unix.Close(o)
		unix.Close(t)
		return nil, nil, os.NewSyscallError("fcntl", err)
	}
	return os.NewFile(uintptr(o), "|ours"), os.NewFile(uintptr(t), "|theirs"), nil
}

// devNull is /dev/null opened once, every child's stdin when it has none.
var devNull = sync.OnceValues(func() (*os.File, error) { return os.Open(os.DevNull) })

func classifyStart(cmd *exec.Cmd, err error) error {
	return fmt.Errorf("start %s: %w", cmd.Path, err)
}

// signal sends sig to p's process group.
func (s *Server) signalGroup(pgid int, sig syscall.Signal) error {
	return syscall.Kill(-pgid, sig)
}

// signalGroups sends sig to every live process group the server started.
func (s *Server) signalGroups(sig syscall.Signal) {
	s.groupsMu.Lock()
	defer s.groupsMu.Unlock()
	for pgid := range s.groups {
		_ = syscall.Kill(-pgid, sig)
	}
}

// terminate sends TERM to the group, then KILL after the grace period
// unless done is closed first.
func (s *Server) terminate(pgid int, done <-chan struct{}) {
	_ = s.signalGroup(pgid, sigTERM)
	select {
	case <-done:
	case <-time.After(s.cfg.KillGrace):
		_ = s.signalGroup(pgid, sigKILL)
	}
}

// pump reads f to EOF, handing each chunk to out (a fresh slice each time).
func pump(f *os.File, stream string, out chan<- chunk) {
	defer f.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := f.Read(buf)
		if n > 0 {
			out <- chunk{stream: stream, data: bytes.Clone(buf[:n])}
		}
		if err != nil {
			if err != io.EOF {
				out <- chunk{stream: stream, err: err}
			}
			out <- chunk{stream: stream, eof: true}
			return
		}
	}
}

type chunk struct {
	stream string
	data   []byte
	err    error
	eof    bool
}

package framework

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A Component is a process of the stack that hack/local-up.sh started and
// recorded in pids/NAME.pid (etcd, kube-apiserver, containerd, kubelet, …).
// Tests use it to take the control plane or the runtime away and bring it
// back exactly as it was: Start runs the same command line in the same
// environment and directory, appending to the same log.
type Component struct {
	Name string
	pid  int
	argv []string
	env  []string
	dir  string
}

// Component reads the running process recorded for name.
func (s *Stack) Component(t testing.TB, name string) *Component {
	t.Helper()
	c, err := readComponent(name)
	if err != nil {
		t.Fatalf("component %s: %v", name, err)
	}
	return c
}

func readComponent(name string) (*Component, error) {
	b, err := os.ReadFile(filepath.Join(StateDir(), "pids", name+".pid"))
	if err != nil {
		return nil, err
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, fmt.Errorf("pid file: %w", err)
	}
	proc := fmt.Sprintf("/proc/%d/", pid)
	cmdline, err := os.ReadFile(proc + "cmdline")
	if err != nil || len(cmdline) == 0 {
		return nil, fmt.Errorf("process %d is not running: %v", pid, err)
	}
	environ, err := os.ReadFile(proc + "environ")
	if err != nil {
		return nil, err
	}
	dir, err := os.Readlink(proc + "cwd")
	if err != nil {
		return nil, err
	}
	split := func(b []byte) []string {
		return strings.Split(string(bytes.TrimRight(b, "\x00")), "\x00")
	}
	return &Component{Name: name, pid: pid, argv: split(cmdline), env: split(environ), dir: dir}, nil
}

// Pid is the process's id (the current one after Start).
func (c *Component) Pid() int { return c.pid }

// Kill sends SIGKILL and waits until the process is gone.
func (c *Component) Kill(t testing.TB) {
	t.Helper()
	if err := syscall.Kill(c.pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill %s (pid %d): %v", c.Name, c.pid, err)
	}
	Eventually(t, 30*time.Second, c.Name+" to be gone", func(context.Context) (bool, error) {
		return !c.Running(), nil
	})
}

// Signal sends sig (SIGSTOP and SIGCONT pause and resume it).
func (c *Component) Signal(t testing.TB, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(c.pid, sig); err != nil {
		t.Fatalf("signal %v to %s (pid %d): %v", sig, c.Name, c.pid, err)
	}
}

// Running reports whether the process still exists (and is not a zombie
// waiting for its parent).
func (c *Component) Running() bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.pid))
	if err != nil {
		return false
	}
	// pid (comm) STATE ...: comm may hold spaces, the state follows the last ')'.
	s := string(b)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}

// Start runs the component again as it ran before, in its own session like
// local-up.sh's start, and records the new pid. The caller waits for it to
// serve.
func (c *Component) Start(t testing.TB) {
	t.Helper()
	if c.Running() {
		t.Fatalf("start %s: pid %d still runs", c.Name, c.pid)
	}
	logf, err := os.OpenFile(filepath.Join(StateDir(), "logs", c.Name+".log"), os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd := exec.Command(c.argv[0], c.argv[1:]...)
	cmd.Env, cmd.Dir = c.env, c.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", c.Name, err)
	}
	c.pid = cmd.Process.Pid
	// Reap it if it ends while the tests run; the stack's scripts stop it
	// by pid otherwise.
	go func() { _ = cmd.Wait() }()
	if err := os.WriteFile(filepath.Join(StateDir(), "pids", c.Name+".pid"), []byte(strconv.Itoa(c.pid)+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

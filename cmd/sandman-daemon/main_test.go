package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
)

// build compiles the daemon once per test binary run.
func build(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "sandman-daemon")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

type running struct {
	cmd    *exec.Cmd
	out    bytes.Buffer
	client *client.Client
	done   chan error
}

func start(t *testing.T, bin string, args ...string) *running {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "d.sock")
	r := &running{done: make(chan error, 1)}
	r.cmd = exec.Command(bin, append([]string{"--listen", "", "--socket", sock, "--allow-unauthenticated",
		"--subreaper", "--grace", "2s", "--state-dir", t.TempDir()}, args...)...)
	r.cmd.Stdout, r.cmd.Stderr = &r.out, &r.out
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { r.done <- r.cmd.Wait() }()
	t.Cleanup(func() {
		_ = r.cmd.Process.Kill()
		<-r.done
	})
	c, err := client.New("unix://"+sock, client.WithRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	r.client = c
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := c.Health(t.Context()); err == nil {
			return r
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon did not answer: %s", r.out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (r *running) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case err := <-r.done:
		r.done <- err
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(timeout):
		// What is left says why: the processes under the daemon.
		ps, _ := exec.Command("ps", "-o", "pid,ppid,pgid,stat,args", "--ppid", strconv.Itoa(r.cmd.Process.Pid)).CombinedOutput()
		t.Fatalf("daemon still running after %v; its children:\n%s\nits output:\n%s", timeout, ps, r.out.String())
		return -1
	}
}

func TestMainProcessExitCode(t *testing.T) {
	bin := build(t)
	r := start(t, bin, "--", "sh", "-c", "echo main-out; exec sleep 300")
	// The main process's output is kept for logs.
	p, err := r.client.Process(t.Context(), "main")
	if err != nil || !p.Running {
		t.Fatalf("main process: %+v %v", p, err)
	}
	// The INT goes once the shell is sleep: dash catches an INT that
	// comes while it runs a -c script and, between commands, can lose it.
	deadline := time.Now().Add(10 * time.Second)
	for {
		cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(p.PID) + "/cmdline")
		if strings.HasPrefix(string(cmdline), "sleep\x00") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the main process is %q, not sleep, after 10 s", cmdline)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := r.client.Signal(t.Context(), "main", "INT"); err != nil {
		t.Fatal(err)
	}
	if code := r.wait(t, 30*time.Second); code != 130 {
		t.Fatalf("daemon exit code %d, want 130 (main killed by INT); output:\n%s", code, r.out.String())
	}
	if !strings.Contains(r.out.String(), "main-out") {
		t.Fatalf("main output not copied to the daemon's stdout:\n%s", r.out.String())
	}
}

func TestSIGTERMStopsEverything(t *testing.T) {
	bin := build(t)
	r := start(t, bin, "--", "sleep", "300")
	bg, err := r.client.StartProcess(t.Context(), api.ProcessRequest{Shell: "trap '' TERM; while :; do sleep 1; done"})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := r.wait(t, 30*time.Second); code != 143 {
		t.Fatalf("exit code %d, want 143; output:\n%s", code, r.out.String())
	}
	if alive(bg.PID) {
		t.Fatalf("background process %d that ignores TERM survived the daemon", bg.PID)
	}
}

// TestReapsOrphans: as a subreaper (as PID 1 would), the daemon reaps
// orphaned grandchildren so no zombie stays.
func TestReapsOrphans(t *testing.T) {
	bin := build(t)
	r := start(t, bin)
	res, err := r.client.Exec(t.Context(), api.ExecRequest{Shell: "sleep 0.2 >/dev/null 2>&1 & echo $!"})
	if err != nil {
		t.Fatal(err)
	}
	orphan, err := strconv.Atoi(strings.TrimSpace(string(res.Stdout)))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for {
		if _, err := os.Stat("/proc/" + strconv.Itoa(orphan)); os.IsNotExist(err) {
			return // exited and reaped
		}
		select {
		case <-ctx.Done():
			b, _ := os.ReadFile("/proc/" + strconv.Itoa(orphan) + "/stat")
			t.Fatalf("orphan %d not reaped: %s", orphan, b)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func TestFlagsErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "", "--socket", ""}, "no token hash"},
		{[]string{"--token-sha256", "nothex"}, "want 64 hex digits"},
		{[]string{"--allow-unauthenticated", "--listen", ""}, "nothing to serve on"},
	} {
		code, err := run(tc.args)
		if err == nil || code == 0 || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%v) = %d, %v; want an error containing %q", tc.args, code, err, tc.want)
		}
	}
}

// TestVersionFlag: --version answers before the flags are checked.
func TestVersionFlag(t *testing.T) {
	if code, err := run([]string{"--version"}); code != 0 || err != nil {
		t.Fatalf("run(--version) = %d, %v", code, err)
	}
}

func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i > 0 && len(s) > i+2 && s[i+2] != 'Z'
}

// TestEnvironmentIsNotSettings: the pod's and the image's environment reach
// commands but never the daemon's settings: SANDMAN_ALLOW_UNAUTHENTICATED=1
// does not turn authentication off and SANDMAN_TOKEN_SHA256 adds no token.
func TestEnvironmentIsNotSettings(t *testing.T) {
	bin := build(t)
	const token, backdoor = "the-pods-token", "an-images-backdoor"
	sock := filepath.Join(t.TempDir(), "d.sock")
	cmd := exec.Command(bin, "--listen", "", "--socket", sock, "--subreaper", "--state-dir", t.TempDir(),
		"--token-sha256", hashHex(token))
	cmd.Env = append(os.Environ(), "SANDMAN_ALLOW_UNAUTHENTICATED=1", "SANDMAN_TOKEN_SHA256="+hashHex(backdoor),
		"SANDMAN_SOCKET=/tmp/elsewhere.sock")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	owner, err := client.New("unix://"+sock, client.WithRetries(0), client.WithToken(token))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := owner.Health(t.Context()); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("daemon did not answer on its --socket: %s", out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for name, tok := range map[string]string{"no token": "", "the image's backdoor token": backdoor} {
		c, _ := client.New("unix://"+sock, client.WithRetries(0), client.WithToken(tok))
		if _, err := c.Exec(t.Context(), api.ExecRequest{Cmd: []string{"true"}}); !client.IsCode(err, api.CodeUnauthorized) {
			t.Errorf("exec with %s: %v, want unauthorized", name, err)
		}
	}
	res, err := owner.Exec(t.Context(), api.ExecRequest{Shell: "echo $SANDMAN_ALLOW_UNAUTHENTICATED"})
	if err != nil || strings.TrimSpace(string(res.Stdout)) != "1" {
		t.Fatalf("the environment should reach commands unchanged: %+v %v", res, err)
	}
}

func hashHex(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// TestHashesNotOnTheCommandLine: token hashes given as flags are wiped from
// the daemon's argv once parsed, so /proc/PID/cmdline does not show them.
func TestHashesNotOnTheCommandLine(t *testing.T) {
	bin := build(t)
	h, assign := hashHex("a-token"), hashHex("an-assign-token")
	r := start(t, bin, "--token-sha256", h, "--assign-token-sha256="+assign)
	b, err := os.ReadFile("/proc/" + strconv.Itoa(r.cmd.Process.Pid) + "/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	cmdline := strings.ReplaceAll(string(b), "\x00", " ")
	if strings.Contains(cmdline, h) || strings.Contains(cmdline, assign) || !strings.Contains(cmdline, "--token-sha256") {
		t.Fatalf("cmdline %q: want the flags without their hashes", cmdline)
	}
}

// TestHold: --hold serves nothing and exits 0 on SIGTERM (the node agent's
// shim-group holder).
func TestHold(t *testing.T) {
	bin := build(t)
	cmd := exec.Command(bin, "--hold")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	// It says so once it handles TERM (signalled earlier, it would die of it).
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil || line != "holding\n" {
		t.Fatalf("first line %q (%v), want holding", line, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }() // after the reads, as StdoutPipe asks
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("holder exit: %v, want 0", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the holder did not stop on SIGTERM")
	}
}

// TestReserveThreads: the reserve leaves at least that many OS threads in
// the process (a test binary runs with far fewer than 64).
func TestReserveThreads(t *testing.T) {
	const n = 64
	if before := osThreads(t); before >= n {
		t.Fatalf("the test process already runs %d threads: the check needs fewer than %d", before, n)
	}
	reserveThreads(n)
	if after := osThreads(t); after < n {
		t.Fatalf("%d threads after reserveThreads(%d)", after, n)
	}
}

// osThreads is the process's thread count: its entries in /proc/self/task.
func osThreads(t *testing.T) int {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	return len(tasks)
}

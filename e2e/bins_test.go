//go:build root || e2e

package e2e

import (
	"bytes"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sandman-dev/sandman/e2e/framework"
)

// built caches one build per command for the test binary.
var built sync.Map // package path → *buildResult

type buildResult struct {
	once sync.Once
	path string
	err  error
}

// buildBinary builds ./cmd/NAME once per test binary into the stack's
// state dir (which local-down removes), statically and stripped.
func buildBinary(t testing.TB, root, name string) string {
	t.Helper()
	v, _ := built.LoadOrStore(name, &buildResult{})
	b := v.(*buildResult)
	b.once.Do(func() {
		dir := filepath.Join(framework.StateDir(), "test-bin")
		if b.err = os.MkdirAll(dir, 0o755); b.err != nil {
			return
		}
		b.path = filepath.Join(dir, name)
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", b.path, "./cmd/"+name)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			b.err = fmt.Errorf("%v\n%s", err, strings.TrimSpace(string(out)))
		}
	})
	if b.err != nil {
		t.Fatalf("build %s: %v", name, b.err)
	}
	return b.path
}

func buildDaemon(t testing.TB, root string) string { return buildBinary(t, root, "sandman-daemon") }
func buildNode(t testing.TB, root string) string   { return buildBinary(t, root, "sandman-node") }

// agent is a sandman-node process.
type agent struct {
	cmd  *exec.Cmd
	out  *bytes.Buffer
	done chan struct{}
	err  error // how the process ended, once done is closed
}

func startAgent(t *testing.T, bin string, args []string) *agent {
	t.Helper()
	a := launchAgent(t, bin, args)
	t.Cleanup(func() { a.stop(t) })
	return a
}

// launchAgent starts a process with the pool token in its environment; the
// caller stops it.
func launchAgent(t *testing.T, bin string, args []string) *agent {
	t.Helper()
	a := &agent{cmd: exec.Command(bin, args...), out: &bytes.Buffer{}, done: make(chan struct{})}
	a.cmd.Env = append(os.Environ(), "SANDMAN_POOL_TOKEN=pool-secret")
	a.cmd.Stdout, a.cmd.Stderr = a.out, a.out
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { a.err = a.cmd.Wait(); close(a.done) }()
	return a
}

// stop sends SIGTERM (a stopping agent tears its warm slots down), kills
// the process if it has not stopped in 30 s, fails the test if it ended
// with an error (a teardown that failed leaves things behind), and prints
// its output if the test failed (or SANDMAN_E2E_AGENT_LOGS is set). A process that had ended before (a test
// killed it) is only waited for.
func (a *agent) stop(t *testing.T) {
	running := true
	select {
	case <-a.done:
		running = false
	default:
	}
	_ = a.cmd.Process.Signal(syscall.SIGTERM)
	asked := time.Now()
	select {
	case <-a.done:
		if running && time.Since(asked) > 5*time.Second {
			t.Logf("%s took %v to stop", filepath.Base(a.cmd.Path), time.Since(asked).Round(time.Millisecond))
		}
		if running && a.err != nil {
			t.Errorf("%s ended with %v on SIGTERM", filepath.Base(a.cmd.Path), a.err)
		}
	case <-time.After(30 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.done
		t.Errorf("%s did not stop on SIGTERM", filepath.Base(a.cmd.Path))
	}
	if t.Failed() || os.Getenv("SANDMAN_E2E_AGENT_LOGS") != "" {
		t.Logf("%s output:\n%s", filepath.Base(a.cmd.Path), a.out.String())
	}
}

// freePort returns a port nothing listens on, and never the same one twice
// in a test binary: a port is free again once its probe listener closes,
// and two agents of one pool were handed the same one.
func freePort(t testing.TB) int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !portsGiven[port] {
			portsGiven[port] = true
			return port
		}
	}
	t.Fatal("no free port not handed out before")
	return 0
}

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// primaryAddr is this machine's address on its default route.
func primaryAddr(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("ip", "-4", "-o", "route", "get", "192.0.2.1").Output()
	if err != nil {
		t.Fatalf("ip route get: %v", err)
	}
	f := strings.Fields(string(out))
	for i, w := range f {
		if w == "src" && i+1 < len(f) {
			if _, err := netip.ParseAddr(f[i+1]); err == nil {
				return f[i+1]
			}
		}
	}
	t.Fatalf("no source address in %q", out)
	return ""
}

// needRunsc fails the test when hack/build-tools.sh has not built gVisor
// (the tier's tools are part of it; nothing is skipped for a missing one).
func needRunsc(t *testing.T, s *framework.Stack) {
	t.Helper()
	if fi, err := os.Stat(s.RunscBin); s.RunscBin == "" || err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("no pinned runsc at %q: build it with hack/build-tools.sh gvisor", s.RunscBin)
	}
}

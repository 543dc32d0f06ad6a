//go:build root

package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/opencontainers/runtime-spec/specs-go"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/e2e/framework"
)

// sandbox is a container whose PID 1 is the daemon, mounted read-only.
type sandbox struct {
	client *client.Client
	logMu  *sync.Mutex
	logs   *bytes.Buffer
	task   containerd.Task
}

func (s *sandbox) logString() string {
	s.logMu.Lock()
	defer s.logMu.Unlock()
	return s.logs.String()
}

const sandboxToken = "root-tier-token"

func startSandbox(t *testing.T, s *framework.Stack, image string, pidsLimit int64, mainCmd ...string) *sandbox {
	t.Helper()
	ctx := t.Context()
	bin := buildDaemon(t, s.Root)
	cc := s.Containerd(t, "sandman-test")
	resolver := docker.NewResolver(docker.ResolverOptions{
		Hosts: docker.ConfigureDefaultRegistries(docker.WithPlainHTTP(docker.MatchLocalhost)),
	})
	img, err := cc.Pull(ctx, image, containerd.WithPullUnpack, containerd.WithResolver(resolver))
	if err != nil {
		t.Fatalf("pull %s: %v", image, err)
	}
	sockDir := t.TempDir()
	sum := sha256.Sum256([]byte(sandboxToken))
	args := []string{"/.sandman/sandman-daemon", "--listen", "", "--socket", "/run/sandman/daemon.sock",
		"--token-sha256", hex.EncodeToString(sum[:]), "--grace", "1s"}
	if len(mainCmd) > 0 {
		args = append(append(args, "--"), mainCmd...)
	}
	id := "daemon-" + rand.String(8)
	container, err := cc.NewContainer(ctx, id,
		containerd.WithNewSnapshot(id, img),
		containerd.WithNewSpec(oci.WithImageConfig(img), oci.WithHostname(id),
			oci.WithProcessArgs(args...),
			oci.WithPidsLimit(pidsLimit),
			oci.WithNoNewPrivileges,
			oci.WithMounts([]specs.Mount{
				{Destination: "/.sandman/sandman-daemon", Type: "bind", Source: bin, Options: []string{"rbind", "ro", "nosuid", "nodev"}},
				{Destination: "/run/sandman", Type: "bind", Source: sockDir, Options: []string{"rbind", "rw"}},
			})),
	)
	if err != nil {
		t.Fatalf("create container: %v", err)
	}
	logs := &bytes.Buffer{}
	var logMu sync.Mutex
	task, err := container.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, lockedWriter{logs, &logMu}, lockedWriter{logs, &logMu})))
	if err != nil {
		t.Fatalf("create task: %v", err)
	}
	t.Cleanup(func() {
		cctx := context.WithoutCancel(ctx)
		_ = task.Kill(cctx, syscall.SIGKILL, containerd.WithKillAll)
		if ch, err := task.Wait(cctx); err == nil {
			select {
			case <-ch:
			case <-time.After(10 * time.Second):
			}
		}
		if _, err := task.Delete(cctx, containerd.WithProcessKill); err != nil {
			t.Errorf("delete task: %v", err)
		}
		if err := container.Delete(cctx, containerd.WithSnapshotCleanup); err != nil {
			t.Errorf("delete container: %v", err)
		}
		if t.Failed() {
			logMu.Lock()
			t.Logf("sandbox logs:\n%s", logs.String())
			logMu.Unlock()
		}
	})
	if err := task.Start(ctx); err != nil {
		t.Fatalf("start task: %v", err)
	}
	c, err := client.New("unix://"+filepath.Join(sockDir, "daemon.sock"), client.WithToken(sandboxToken), client.WithRetries(0))
	if err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 20*time.Second, "the daemon in "+image+" to answer", func(ctx context.Context) (bool, error) {
		_, err := c.Health(ctx)
		return err == nil, nil
	})
	return &sandbox{client: c, logMu: &logMu, logs: logs, task: task}
}

type lockedWriter struct {
	w  io.Writer
	mu *sync.Mutex
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestRootDaemonInImages runs the daemon as PID 1 of real containers made
// from the busybox, no-shell and Debian images and drives it with the client.
func TestRootDaemonInImages(t *testing.T) {
	s := framework.Get(t)
	cases := []struct {
		name    string
		image   string
		argv    []string // a program the image has
		want    string
		shell   bool
		session string // a command for a session, if the image has a shell
	}{
		{"busybox", s.BusyboxImage, []string{"busybox", "echo", "hi"}, "hi\n", true, "cd /tmp && export A=1"},
		{"noshell", s.NoShellImage, []string{"/bin/noshell", "hi"}, "hi\n", false, ""},
		{"debian", s.DebianImage, []string{"python3", "-c", "print('hi')"}, "hi\n", true, "cd /tmp && git init -q repo && export A=1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			sb := startSandbox(t, s, tc.image, 256)
			c, ctx := sb.client, t.Context()

			res, err := c.Exec(ctx, api.ExecRequest{Cmd: tc.argv})
			if err != nil || string(res.Stdout) != tc.want {
				t.Fatalf("exec %v: %v %q", tc.argv, err, stdout(res))
			}
			// The daemon is PID 1.
			rc, err := c.ReadFile(ctx, "/proc/1/cmdline")
			if err != nil {
				t.Fatal(err)
			}
			cmdline, _ := io.ReadAll(rc)
			rc.Close()
			if !strings.HasPrefix(string(cmdline), "/.sandman/sandman-daemon\x00") {
				t.Fatalf("PID 1 is %q", cmdline)
			}
			// Its binary cannot be changed from inside.
			if _, err := c.WriteFile(ctx, "/.sandman/sandman-daemon", strings.NewReader("x"), 0o755); err == nil {
				t.Fatal("overwrote the daemon binary from inside the sandbox")
			}
			// Files persist between calls.
			if _, err := c.WriteFile(ctx, "/work/in.txt", strings.NewReader("data"), 0); err != nil {
				t.Fatal(err)
			}
			if l, err := c.List(ctx, "/work", 1); err != nil || len(l.Entries) != 1 {
				t.Fatalf("list /work: %+v %v", l, err)
			}
			if !tc.shell {
				_, err := c.Exec(ctx, api.ExecRequest{Shell: "echo hi"})
				if !client.IsCode(err, api.CodeNoShell) {
					t.Fatalf("shell exec in an image without a shell: %v", err)
				}
				_, err = c.CreateSession(ctx, api.SessionRequest{})
				if !client.IsCode(err, api.CodeNoShell) {
					t.Fatalf("session in an image without a shell: %v", err)
				}
				return
			}
			res, err = c.Exec(ctx, api.ExecRequest{Shell: "cat /work/in.txt; echo; id -u; hostname"})
			if err != nil || !strings.HasPrefix(string(res.Stdout), "data\n0\ndaemon-") {
				t.Fatalf("shell exec: %v %q", err, stdout(res))
			}
			sess, err := c.CreateSession(ctx, api.SessionRequest{})
			if err != nil {
				t.Fatal(err)
			}
			if r, err := c.Run(ctx, sess.ID, api.RunRequest{Command: tc.session}); err != nil || r.ExitCode != 0 {
				t.Fatalf("session: %v %q", err, stdout(r))
			}
			if r, err := c.Run(ctx, sess.ID, api.RunRequest{Command: "pwd; echo $A"}); err != nil || string(r.Stdout) != "/tmp\n1\n" {
				t.Fatalf("session state: %v %q", err, stdout(r))
			}
		})
	}
}

// TestRootDaemonForkBomb: a fork bomb hits the sandbox's pids limit, the
// exec fails or times out, and the daemon keeps serving.
func TestRootDaemonForkBomb(t *testing.T) {
	s := framework.Get(t)
	sb := startSandbox(t, s, s.BusyboxImage, 64)
	ctx := t.Context()
	// The bomb either exhausts the pids limit (forks fail) or runs into the
	// timeout; either way the exec answers, and at its deadline every
	// process it left behind is killed.
	res, err := sb.client.Exec(ctx, api.ExecRequest{Shell: "bomb() { bomb | bomb & }; bomb; sleep 2", TimeoutSeconds: 3, MaxOutputBytes: 4096})
	if err != nil && !client.IsCode(err, api.CodeTooManyRequests) {
		t.Fatalf("fork bomb exec: %v", err)
	}
	if err == nil {
		t.Logf("fork bomb exec: exit %d timed_out %v, %d bytes of stderr", res.ExitCode, res.TimedOut, len(res.Stderr))
	}
	framework.Eventually(t, 30*time.Second, "the sandbox to recover from the fork bomb", func(ctx context.Context) (bool, error) {
		r, err := sb.client.Exec(ctx, api.ExecRequest{Cmd: []string{"echo", "alive"}})
		return err == nil && string(r.Stdout) == "alive\n", nil
	})
	if h, err := sb.client.Health(ctx); err != nil || h.Status != "ok" {
		t.Fatalf("health after the bomb: %+v %v", h, err)
	}
}

// TestRootDaemonMainProcess: the pod's command runs as the main process and
// the sandbox ends with its exit code.
func TestRootDaemonMainProcess(t *testing.T) {
	s := framework.Get(t)
	sb := startSandbox(t, s, s.BusyboxImage, 64, "sh", "-c", "while [ ! -e /tmp/go ]; do sleep 0.05; done; echo main says hi; exit 7")
	ctx := t.Context()
	if p, err := sb.client.Process(ctx, "main"); err != nil || !p.Running {
		t.Fatalf("main process: running=%v err=%v", p.Running, err)
	}
	st, err := sb.task.Wait(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sb.client.WriteFile(ctx, "/tmp/go", strings.NewReader(""), 0); err != nil {
		t.Fatal(err)
	}
	select {
	case es := <-st:
		if es.ExitCode() != 7 {
			t.Fatalf("sandbox exit %d, want 7", es.ExitCode())
		}
		if !strings.Contains(sb.logString(), "main says hi") {
			t.Fatalf("main output missing from the container's output:\n%s", sb.logString())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("sandbox did not exit with its main process")
	}
}

// stdout is a short description of a result for failure messages.
func stdout(r *client.ExecResult) string {
	if r == nil {
		return "<no result>"
	}
	out := string(r.Stdout) + "|" + string(r.Stderr)
	if len(out) > 500 {
		out = out[:500] + "..."
	}
	return "exit " + strconv.Itoa(r.ExitCode) + ": " + out
}

//go:build root

package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
	rtcontainerd "github.com/sandman-dev/sandman/runtime/containerd"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

const runtimeNamespace = "sandman-rt"

// newContainerdRuntime starts a containerd runtime against the stack and
// destroys it (and checks nothing is left) when the test ends.
func newContainerdRuntime(t *testing.T, s *framework.Stack, slots, warm int) *rtcontainerd.Runtime {
	t.Helper()
	node := "rt-" + rand.String(6)
	stateDir := filepath.Join(framework.StateDir(), "test-runtimes", node)
	cc := s.Containerd(t, runtimeNamespace)
	logLevel := slog.LevelWarn
	if os.Getenv("SANDMAN_TEST_DEBUG") != "" {
		logLevel = slog.LevelDebug
	}
	rt, err := rtcontainerd.New(t.Context(), rtcontainerd.Config{
		Client: cc, Namespace: runtimeNamespace, Node: node, Slots: slots, WarmSlots: warm,
		StateDir: stateDir, DaemonPath: buildDaemon(t, s.Root),
		CNIConfDir: s.CNIConfDir, CNIBinDir: s.CNIBinDir, PidsLimit: 256,
		Resources: runtime.Resources{MilliCPU: 64000, MemoryBytes: 64 << 30},
		Logger:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: logLevel})),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = rt.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		dctx, dcancel := context.WithTimeout(context.Background(), time.Minute)
		defer dcancel()
		if err := rt.Destroy(dctx); err != nil {
			t.Errorf("destroy runtime: %v", err)
		}
		left, err := cc.Containers(dctx, fmt.Sprintf(`labels."%s"==%s`, rtcontainerd.LabelNode, node))
		if err != nil || len(left) > 0 {
			t.Errorf("containers left after destroy: %d (%v)", len(left), err)
		}
		if entries, _ := os.ReadDir(filepath.Join(stateDir, "netns")); len(entries) > 0 {
			t.Errorf("%d network namespaces left after destroy", len(entries))
		}
		_ = os.RemoveAll(stateDir)
	})
	return rt
}

func sandboxExec(ctx context.Context, slot runtime.Slot, token string, argv ...string) (string, error) {
	c, err := client.New(fmt.Sprintf("%s:%d", slot.IP, api.Port), client.WithToken(token), client.WithRetries(0))
	if err != nil {
		return "", err
	}
	res, err := c.Exec(ctx, api.ExecRequest{Cmd: argv})
	if err != nil {
		return "", err
	}
	return string(res.Stdout), nil
}

// TestRootContainerdConformance runs the runtime contract's suite against
// the containerd runtime on the stack's containerd, runc and CNI.
func TestRootContainerdConformance(t *testing.T) {
	s := framework.Get(t)
	runtimetest.Suite(t, func(t *testing.T) runtimetest.Harness {
		return runtimetest.Harness{
			Runtime: newContainerdRuntime(t, s, 3, 2), Slots: 3, WarmSlots: 2,
			Image: s.BusyboxImage, NoShellImage: s.NoShellImage, MissingImage: s.Registry + "/sandman/nope:missing",
			Exec:    sandboxExec,
			Timeout: 60 * time.Second,
		}
	})
}

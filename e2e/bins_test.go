//go:build root || e2e

package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

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

// Package gvisortest runs a test binary's own tests again inside a gVisor
// sandbox, with the runsc that hack/lib.sh pins (`runsc do`, the host's
// root filesystem under an overlay, no network), so that what the daemon
// asks of the kernel — credentials, permissions, inotify — is tested
// against gVisor's kernel as well as Linux's, without the local stack.
// Tests import it; the daemon does not.
package gvisortest

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// insideEnv marks the process Rerun starts inside the sandbox.
const insideEnv = "SANDMAN_GVISORTEST_INSIDE"

// Rerun runs the named top-level tests of the calling test binary inside
// a gVisor sandbox, as root, and fails t unless every one of them ran
// there and passed: a skip inside fails here, as a test that did not run
// at all does. Inside the sandbox Rerun skips. It needs root and the
// pinned runsc (hack/build-tools.sh gvisor); without runsc it fails, as
// the root tier's tools are part of it.
func Rerun(t *testing.T, tests ...string) {
	t.Helper()
	if os.Getenv(insideEnv) != "" {
		t.Skip("inside the gVisor sandbox already")
	}
	if os.Geteuid() != 0 {
		t.Skip("runsc do needs root (the root tier runs it)")
	}
	if len(tests) == 0 {
		t.Fatal("Rerun: name the tests to run")
	}
	quoted := make([]string, len(tests))
	for i, name := range tests {
		quoted[i] = regexp.QuoteMeta(name)
	}
	pattern := "^(" + strings.Join(quoted, "|") + ")$"
	runsc := pinnedRunsc(t)
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, runsc, "--root", t.TempDir(), "--network=none", "--ignore-cgroups",
		"do", "--", self, "-test.run", pattern, "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), insideEnv+"=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	runErr := cmd.Run()
	t.Logf("%d tests of %s under %s do: %s in %v", len(tests), filepath.Base(self), runsc, exitText(runErr), time.Since(start).Round(time.Millisecond))
	results := topLevelResults(out.String())
	failed := runErr != nil
	for _, name := range tests {
		if got := results[name]; got != "PASS" {
			failed = true
			if got == "" {
				got = "did not run"
			}
			t.Errorf("%s under gVisor: %s", name, got)
		}
	}
	if failed {
		t.Fatalf("the tests under gVisor (%s):\n%s", exitText(runErr), out.String())
	}
}

var resultLine = regexp.MustCompile(`(?m)^--- (PASS|FAIL|SKIP): (\S+) `)

// topLevelResults reads `go test -v` output: each top-level test's result
// (subtests are indented).
func topLevelResults(out string) map[string]string {
	res := map[string]string{}
	for _, m := range resultLine.FindAllStringSubmatch(out, -1) {
		res[m[2]] = m[1]
	}
	return res
}

func exitText(err error) string {
	if err == nil {
		return "exit 0"
	}
	return err.Error()
}

// pinnedRunsc is $RUNSC_BIN as hack/lib.sh defines it (its one
// definition: the tools cache of the pinned gVisor version).
func pinnedRunsc(t *testing.T) string {
	t.Helper()
	lib, err := findLib()
	if err != nil {
		t.Fatal(err)
	}
	b, err := exec.Command("bash", "-c", `source "$1" && printf %s "$RUNSC_BIN"`, "bash", lib).Output()
	if err != nil {
		t.Fatalf("read RUNSC_BIN from %s: %v", lib, err)
	}
	p := strings.TrimSpace(string(b))
	if fi, err := os.Stat(p); p == "" || err != nil || fi.Mode()&0o111 == 0 {
		t.Fatalf("no pinned runsc at %q: build it with hack/build-tools.sh gvisor", p)
	}
	return p
}

// findLib walks up from the working directory (the package's, under go
// test) to the repository's hack/lib.sh.
func findLib() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		p := filepath.Join(dir, "hack", "lib.sh")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no hack/lib.sh above the working directory: run the test from the repository")
		}
		dir = parent
	}
}

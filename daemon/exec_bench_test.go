package daemon_test

import (
	"crypto/sha256"
	"net/http/httptest"
	"os/exec"
	"testing"

	"github.com/sandman-dev/sandman/daemon"
	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
)

// BenchmarkForkExecTrue is the baseline of BenchmarkExecTrue: Go's own
// fork+exec+wait of `true`.
func BenchmarkForkExecTrue(b *testing.B) {
	path, err := exec.LookPath("true")
	if err != nil {
		b.Skip("no true on PATH")
	}
	for b.Loop() {
		if err := exec.Command(path).Run(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExecTrue is the daemon's exec round trip of `true` over
// loopback HTTP (the client in the same process), each child waited for
// alone (a reaper of every child, as the daemon is as PID 1, would take
// the statuses of the test binary's other children too): profile it with
// -cpuprofile to see where the time beyond the fork+exec goes.
func BenchmarkExecTrue(b *testing.B) {
	srv, err := daemon.New(daemon.Config{
		TokenHashes: [][sha256.Size]byte{sha256.Sum256([]byte(testToken))},
		StateDir:    b.TempDir(),
		Dir:         b.TempDir(),
	})
	if err != nil {
		b.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	c, err := client.New(ts.URL, client.WithToken(testToken))
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		r, err := c.Exec(b.Context(), api.ExecRequest{Cmd: []string{"true"}})
		if err != nil || r.ExitCode != 0 {
			b.Fatalf("exec true: %v, %+v", err, r)
		}
	}
}

package daemon_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/sandman-dev/sandman/daemon"
	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
)

const testToken = "test-token-0123456789"

// harness is a daemon served over real HTTP on loopback, with a client
// holding the right token.
type harness struct {
	srv    *daemon.Server
	url    string
	client *client.Client
}

func newHarness(t *testing.T, mutate ...func(*daemon.Config)) *harness {
	t.Helper()
	cfg := daemon.Config{
		TokenHashes: [][sha256.Size]byte{sha256.Sum256([]byte(testToken))},
		StateDir:    t.TempDir(),
		Dir:         t.TempDir(),
		KillGrace:   500 * time.Millisecond,
	}
	for _, m := range mutate {
		m(&cfg)
	}
	srv, err := daemon.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		ts.CloseClientConnections()
		ts.Close()
	})
	c, err := client.New(ts.URL, client.WithToken(testToken))
	if err != nil {
		t.Fatal(err)
	}
	return &harness{srv: srv, url: ts.URL, client: c}
}

// eventually polls cond until it holds or the timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

type daemonConfig = daemon.Config

func newServerNoAuth() (*daemon.Server, error) { return daemon.New(daemon.Config{}) }

func (h *harness) sessions(t *testing.T) ([]api.Session, error) {
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, h.url+"/v1/sessions", nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var out []api.Session
	return out, json.NewDecoder(resp.Body).Decode(&out)
}

// groupMembers lists the processes in process group pgid.
func groupMembers(pgid int) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if pg, err := syscall.Getpgid(pid); err == nil && pg == pgid && alive(pid) {
			out = append(out, pid)
		}
	}
	return out
}

package noderuntime

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/runtime"
)

// assignment is how a bound pod's tokens reach its daemons. A command line
// is readable by any process in the sandbox (/proc/1/cmdline), so a daemon
// starts with only the hash of a one-time assign token there, and the agent
// then hands it the pod's token hashes over the API (POST /v1/assign, the
// hot-slot handover). The assignment is kept in the slot's directory (root's,
// on the host) until every daemon took it, so an agent restarted in between
// finishes the handover.
type assignment struct {
	Token                string   `json:"token"`
	TokenHashes          []string `json:"token_hashes,omitempty"`
	AllowUnauthenticated bool     `json:"allow_unauthenticated,omitempty"`
	// Containers is how many daemons there are: container i's listens on
	// api.Port+i.
	Containers int `json:"containers"`
}

const assignmentFile = "assign.json"

func newAssignment(req runtime.BindRequest) *assignment {
	var tok [16]byte
	_, _ = rand.Read(tok[:])
	return &assignment{
		Token: hex.EncodeToString(tok[:]), TokenHashes: req.TokenHashes,
		AllowUnauthenticated: req.AllowUnauthenticated, Containers: len(req.Containers),
	}
}

// hash is what a daemon's --assign-token-sha256 gets.
func (a *assignment) hash() string {
	sum := sha256.Sum256([]byte(a.Token))
	return hex.EncodeToString(sum[:])
}

func (a *assignment) save(dir string) error {
	b, _ := json.Marshal(a)
	if err := os.WriteFile(filepath.Join(dir, assignmentFile), b, 0o600); err != nil {
		return fmt.Errorf("keep the sandbox's assignment: %w", err)
	}
	return nil
}

// loadAssignment reads a slot's pending assignment; nil when there is none
// (every daemon took it).
func loadAssignment(dir string) *assignment {
	b, err := os.ReadFile(filepath.Join(dir, assignmentFile))
	if err != nil {
		return nil
	}
	var a assignment
	if json.Unmarshal(b, &a) != nil || a.Token == "" {
		return nil
	}
	return &a
}

// assign hands the assignment to every daemon of the slot at ip. It
// returns nil once all took it (or had taken it before: 409), and removes
// the file from dir.
func (r *Runtime) assign(ctx context.Context, ip, dir string, a *assignment) error {
	body, _ := json.Marshal(api.AssignRequest{TokenHashes: a.TokenHashes, AllowUnauthenticated: a.AllowUnauthenticated})
	for i := range a.Containers {
		url := "http://" + ip + ":" + strconv.Itoa(api.Port+i) + "/v1/assign"
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+a.Token)
		resp, err := r.health.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusConflict {
			return fmt.Errorf("daemon %d answered the assignment with %s", i, resp.Status)
		}
	}
	clearAssignment(dir)
	return nil
}

// clearAssignment removes a slot's pending assignment: every daemon took
// it, or its pod is gone (released, or its bind failed).
func clearAssignment(dir string) {
	_ = os.Remove(filepath.Join(dir, assignmentFile))
}

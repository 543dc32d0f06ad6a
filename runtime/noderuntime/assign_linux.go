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
	// Bearer, when set, is the assign token of the sandbox a fork was
	// restored from, which its daemon still holds: the assignment is a
	// re-assignment (Token's hash becomes the daemon's next assign token).
	Bearer string `json:"bearer,omitempty"`
}

// assignmentFile holds a pending assignment; assignKeyFile, once the
// daemon took it, the token it holds as its assign token (a fork's
// re-assignment needs it).
const (
	assignmentFile = "assign.json"
	assignKeyFile  = "assign.key"
)

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
	ar := api.AssignRequest{TokenHashes: a.TokenHashes, AllowUnauthenticated: a.AllowUnauthenticated}
	bearers := []string{a.Token}
	if a.Bearer != "" {
		// A fork's daemon holds its source's assign token, or ours if it
		// took this re-assignment before (an agent restarted meanwhile).
		ar.Reassign, ar.NextAssignTokenSHA256 = true, a.hash()
		bearers = []string{a.Bearer, a.Token}
	}
	body, _ := json.Marshal(ar)
	for i := range a.Containers {
		url := "http://" + ip + ":" + strconv.Itoa(api.Port+i) + "/v1/assign"
		status := 0
		for _, bearer := range bearers {
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
			req.Header.Set("Authorization", "Bearer "+bearer)
			resp, err := r.health.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if status = resp.StatusCode; status != http.StatusUnauthorized {
				break
			}
		}
		if status != http.StatusOK && status != http.StatusConflict {
			return fmt.Errorf("daemon %d answered the assignment with %s", i, http.StatusText(status))
		}
	}
	if err := os.WriteFile(filepath.Join(dir, assignKeyFile), []byte(a.Token), 0o600); err != nil {
		return fmt.Errorf("keep the daemon's assign token: %w", err)
	}
	_ = os.Remove(filepath.Join(dir, assignmentFile))
	return nil
}

// clearAssignment removes a slot's assignment, pending or taken: its pod
// is gone (released, or its bind failed).
func clearAssignment(dir string) {
	_ = os.Remove(filepath.Join(dir, assignmentFile))
	_ = os.Remove(filepath.Join(dir, assignKeyFile))
}

package daemon_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/sandman-dev/sandman/daemon"
	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
)

// TestAssign: a hot (unassigned) daemon serves nothing but health until the
// node agent assigns it, with the assign token, to a pod's tokens and env.
func TestAssign(t *testing.T) {
	assignSum := sha256.Sum256([]byte("assign-secret"))
	h := newHarness(t, func(c *daemonConfig) {
		c.TokenHashes = nil
		c.AssignTokenHash = &assignSum
	})
	ctx := t.Context()
	if hl, err := h.client.Health(ctx); err != nil || hl.Status != "waiting" {
		t.Fatalf("health before assignment: %+v %v", hl, err)
	}
	if _, err := h.client.Exec(ctx, api.ExecRequest{Cmd: []string{"true"}}); !client.IsCode(err, api.CodeUnavailable) {
		t.Fatalf("exec before assignment: %v", err)
	}
	podSum := sha256.Sum256([]byte(testToken))
	assign := func(token string) int {
		body, _ := json.Marshal(api.AssignRequest{TokenHashes: []string{hex.EncodeToString(podSum[:])}, Env: []string{"POD_VAR=set"}})
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.url+"/v1/assign", bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := assign(testToken); code != http.StatusUnauthorized {
		t.Fatalf("assign with the pod's token: %d, want 401", code)
	}
	if code := assign("assign-secret"); code != http.StatusOK {
		t.Fatalf("assign: %d", code)
	}
	if code := assign("assign-secret"); code != http.StatusConflict {
		t.Fatalf("second assign: %d, want 409", code)
	}
	res, err := h.client.Exec(ctx, api.ExecRequest{Shell: "echo $POD_VAR"})
	if err != nil || string(res.Stdout) != "set\n" {
		t.Fatalf("exec after assignment: %v %q", err, res.Stdout)
	}
}

// TestReassign: a sandbox restored from another's checkpoint (a fork) is
// re-assigned by the node agent to its own pod's tokens: the old tokens
// stop working, the new one works, the assign token is spent (the next one
// takes over), and a re-assignment cannot set the environment.
func TestReassign(t *testing.T) {
	assignSum := sha256.Sum256([]byte("assign-secret"))
	h := newHarness(t, func(c *daemonConfig) {
		c.TokenHashes = nil
		c.AssignTokenHash = &assignSum
	})
	ctx := t.Context()
	hashOf := func(tok string) string {
		sum := sha256.Sum256([]byte(tok))
		return hex.EncodeToString(sum[:])
	}
	post := func(bearer string, req api.AssignRequest) int {
		body, _ := json.Marshal(req)
		r, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.url+"/v1/assign", bytes.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+bearer)
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	reassign := api.AssignRequest{TokenHashes: []string{hashOf("fork-token")}, Reassign: true, NextAssignTokenSHA256: hashOf("next-assign")}
	if code := post("assign-secret", reassign); code != http.StatusConflict {
		t.Fatalf("re-assign before any assignment: %d, want 409", code)
	}
	if code := post("assign-secret", api.AssignRequest{TokenHashes: []string{hashOf(testToken)}}); code != http.StatusOK {
		t.Fatalf("assign: %d", code)
	}
	if _, err := h.client.Exec(ctx, api.ExecRequest{Cmd: []string{"true"}}); err != nil {
		t.Fatalf("exec with the source's token: %v", err)
	}
	if code := post("assign-secret", api.AssignRequest{TokenHashes: reassign.TokenHashes, Reassign: true}); code != http.StatusBadRequest {
		t.Errorf("re-assign without the next assign token: %d, want 400", code)
	}
	withEnv := reassign
	withEnv.Env = []string{"X=1"}
	if code := post("assign-secret", withEnv); code != http.StatusBadRequest {
		t.Errorf("re-assign with env: %d, want 400", code)
	}
	if code := post(testToken, reassign); code != http.StatusUnauthorized {
		t.Errorf("re-assign with the pod's token: %d, want 401", code)
	}
	if code := post("assign-secret", reassign); code != http.StatusOK {
		t.Fatalf("re-assign: %d", code)
	}
	if _, err := h.client.Exec(ctx, api.ExecRequest{Cmd: []string{"true"}}); !client.IsCode(err, api.CodeUnauthorized) {
		t.Errorf("exec with the source's token after the re-assignment: %v, want unauthorized", err)
	}
	forked, _ := client.New(h.url, client.WithToken("fork-token"))
	if res, err := forked.Exec(ctx, api.ExecRequest{Shell: "echo ok"}); err != nil || string(res.Stdout) != "ok\n" {
		t.Errorf("exec with the fork's token: %v %q", err, res.Stdout)
	}
	if code := post("assign-secret", reassign); code != http.StatusUnauthorized {
		t.Errorf("re-assign with the spent assign token: %d, want 401", code)
	}
	if code := post("next-assign", reassign); code != http.StatusOK {
		t.Errorf("re-assign with the next assign token (the agent retrying): %d, want 200", code)
	}
}

// TestHealthWithoutTokenSaysOnlyUp: unauthenticated health tells whether
// the daemon is up, not its version, activity or processes; with the
// sandbox's token it tells everything.
func TestHealthWithoutTokenSaysOnlyUp(t *testing.T) {
	h := newHarness(t, func(c *daemon.Config) { c.Version = "v9.9.9" })
	get := func(token string) map[string]any {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, h.url+"/v1/health", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var m map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("health: %d %v", resp.StatusCode, err)
		}
		return m
	}
	if m := get(""); len(m) != 1 || m["status"] != "ok" {
		t.Errorf("health without a token: %v, want only status ok", m)
	}
	if m := get("a-wrong-token"); len(m) != 1 {
		t.Errorf("health with a wrong token: %v, want only status", m)
	}
	if m := get(testToken); m["version"] != "v9.9.9" || m["idle_seconds"] == nil {
		t.Errorf("health with the token: %v, want version and idle_seconds", m)
	}
}

package daemon_test

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandman-dev/sandman/daemon"
	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
)

func hashOf(tok string) string {
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:])
}

// TestRotateToken: POST /v1/token replaces the caller's own token and only
// that one; a malformed hash changes nothing.
func TestRotateToken(t *testing.T) {
	const oldCtl, newCtl = "control-old", "control-new"
	h := newHarness(t, func(c *daemon.Config) {
		c.TokenHashes = append(c.TokenHashes, sha256.Sum256([]byte(oldCtl)))
	})
	with := func(tok string) *client.Client {
		c, err := client.New(h.url, client.WithToken(tok), client.WithRetries(0))
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ctx := t.Context()
	// accepted says whether tok reaches an authenticated endpoint; health
	// with a token is not activity.
	accepted := func(tok string) bool {
		hl, err := with(tok).Health(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return hl.Version != ""
	}

	for _, bad := range []string{"", "abc", strings.Repeat("a", 63), strings.Repeat("z", 64), hashOf(newCtl) + "00"} {
		t.Run("malformed "+bad, func(t *testing.T) {
			err := with(oldCtl).RotateToken(ctx, bad)
			if !client.IsCode(err, api.CodeBadRequest) || !strings.Contains(err.Error(), "64 hex digits") {
				t.Fatalf("RotateToken(%q): %v, want bad_request naming 64 hex digits", bad, err)
			}
			if !accepted(oldCtl) || accepted(newCtl) || !accepted(testToken) {
				t.Fatal("a refused rotation changed the tokens")
			}
		})
	}

	if err := with(oldCtl).RotateToken(ctx, hashOf(newCtl)); err != nil {
		t.Fatal(err)
	}
	if accepted(oldCtl) {
		t.Error("the replaced token still works")
	}
	if !accepted(newCtl) {
		t.Error("the new token does not work")
	}
	if !accepted(testToken) {
		t.Error("the other (trainer's) token stopped working")
	}
	if err := with(oldCtl).Renew(ctx); !client.IsCode(err, api.CodeUnauthorized) {
		t.Errorf("renew with the replaced token: %v, want unauthorized", err)
	}
	if err := with(newCtl).Renew(ctx); err != nil {
		t.Errorf("renew with the new token: %v", err)
	}
	// The replaced token cannot rotate again.
	if err := with(oldCtl).RotateToken(ctx, hashOf("x")); !client.IsCode(err, api.CodeUnauthorized) {
		t.Errorf("rotate with the replaced token: %v, want unauthorized", err)
	}
	// The trainer's token rotates only itself.
	if err := with(testToken).RotateToken(ctx, hashOf("trainer-2")); err != nil {
		t.Fatal(err)
	}
	if accepted(testToken) || !accepted("trainer-2") || !accepted(newCtl) {
		t.Error("rotating the trainer's token: want only it replaced")
	}
}

// TestRotateTokenIsNotActivity: re-keying an idle sandbox leaves it idle.
func TestRotateTokenIsNotActivity(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(1_000_000, 0)
	h := newHarness(t, func(c *daemon.Config) {
		c.Now = func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	})
	mu.Lock()
	now = now.Add(90 * time.Second)
	mu.Unlock()
	if err := h.client.RotateToken(t.Context(), hashOf("next")); err != nil {
		t.Fatal(err)
	}
	if idle := h.srv.IdleSeconds(); idle != 90 {
		t.Fatalf("idle %v s after a rotation, want 90", idle)
	}
}

// TestRotateTokenUnauthenticated: a sandbox without tokens has none to
// replace.
func TestRotateTokenUnauthenticated(t *testing.T) {
	h := newHarness(t, func(c *daemon.Config) { c.TokenHashes, c.AllowUnauthenticated = nil, true })
	err := h.client.RotateToken(t.Context(), hashOf("next"))
	if !client.IsCode(err, api.CodeBadRequest) || !strings.Contains(err.Error(), "no token to replace") {
		t.Fatalf("got %v, want bad_request saying there is no token to replace", err)
	}
}

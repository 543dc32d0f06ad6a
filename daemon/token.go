package daemon

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/sandman-dev/sandman/daemon/api"
)

// rotateToken replaces the token the caller authenticated with by another:
// POST /v1/token {"token_sha256":"<hex>"}. The sandbox's other tokens stay,
// so the control plane re-keys its own token without touching a trainer's.
// The swap is atomic: a call in flight is checked against the old set or
// the new one, never a mix. It is not activity (idle_seconds goes on).
func (s *Server) rotateToken(w http.ResponseWriter, r *http.Request) {
	var req api.TokenRequest
	if err := s.decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	next, err := ParseTokenHash(req.TokenSHA256)
	if err != nil {
		writeError(w, errf(http.StatusBadRequest, api.CodeBadRequest,
			"token_sha256 %q: want the hex SHA-256 of the new token (64 hex digits)", req.TokenSHA256))
		return
	}
	tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	sum := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	for {
		old := s.access.Load()
		hashes := make([][sha256.Size]byte, len(old.hashes))
		found := false
		for i, h := range old.hashes {
			hashes[i] = h
			if subtle.ConstantTimeCompare(sum[:], h[:]) == 1 {
				hashes[i] = next
				found = true
			}
		}
		switch {
		case !found && old.allowUnauth:
			// Only an unauthenticated sandbox lets a call without one of
			// its tokens in.
			writeError(w, errf(http.StatusBadRequest, api.CodeBadRequest,
				"this call carries none of the sandbox's tokens, so there is no token to replace: send the token to replace as the bearer token"))
			return
		case !found:
			// Replaced by a concurrent call since it was checked.
			writeError(w, errf(http.StatusUnauthorized, api.CodeUnauthorized, "the bearer token was replaced meanwhile"))
			return
		}
		upd := *old
		upd.hashes = hashes
		if s.access.CompareAndSwap(old, &upd) {
			break
		}
	}
	w.WriteHeader(http.StatusNoContent)
}

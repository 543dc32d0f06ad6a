package daemon

import (
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"

	"github.com/sandman-dev/sandman/daemon/api"
)

// access is the part of the configuration an assignment sets.
type access struct {
	hashes      [][sha256.Size]byte
	allowUnauth bool
	env         []string
	dir         string
	assigned    bool
	// assignHash is the SHA-256 of the token that may assign (and, once
	// assigned, re-assign) the sandbox: the node agent's. Nil: none may.
	assignHash *[sha256.Size]byte
}

// accepts reports, in constant time, whether tok is one of the sandbox's
// tokens.
func (a *access) accepts(tok string) bool {
	sum := sha256.Sum256([]byte(strings.TrimSpace(tok)))
	match := 0
	for _, h := range a.hashes {
		match |= subtle.ConstantTimeCompare(sum[:], h[:])
	}
	return match == 1
}

// assign hands a waiting (hot) sandbox to a pod: POST /v1/assign with the
// assign token as bearer. It works once, except as a re-assignment: a
// sandbox restored from another's checkpoint (a fork) still holds that
// one's tokens, and the node agent hands it its own pod's (Reassign), with
// the hash of the next assign token, so the token it used is spent. A
// re-assignment sets the tokens alone: the sandbox's processes, environment
// and directory go on as they were.
func (s *Server) assign(w http.ResponseWriter, r *http.Request) {
	old := s.access.Load()
	if old.assignHash == nil {
		writeError(w, errf(http.StatusNotFound, api.CodeNotFound, "this sandbox is not waiting for an assignment"))
		return
	}
	tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	sum := sha256.Sum256([]byte(tok))
	if subtle.ConstantTimeCompare(sum[:], old.assignHash[:]) != 1 {
		writeError(w, errf(http.StatusUnauthorized, api.CodeUnauthorized, "wrong assign token"))
		return
	}
	var req api.AssignRequest
	if err := s.decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	if len(req.TokenHashes) == 0 && !req.AllowUnauthenticated {
		writeError(w, errf(http.StatusBadRequest, api.CodeBadRequest, "an assignment needs token hashes (or allow_unauthenticated)"))
		return
	}
	if err := checkRestartPolicy(req.RestartPolicy); err != nil {
		writeError(w, errf(http.StatusBadRequest, api.CodeBadRequest, "%v", err))
		return
	}
	hashes := make([][sha256.Size]byte, 0, len(req.TokenHashes))
	for _, h := range req.TokenHashes {
		sum, err := ParseTokenHash(h)
		if err != nil {
			writeError(w, errf(http.StatusBadRequest, api.CodeBadRequest, "%v", err))
			return
		}
		hashes = append(hashes, sum)
	}
	var next *access
	switch {
	case req.Reassign:
		if len(req.Main) > 0 || len(req.Env) > 0 || req.Dir != "" {
			writeError(w, errf(http.StatusBadRequest, api.CodeBadRequest, "a re-assignment sets tokens only: its processes, environment and directory go on"))
			return
		}
		nextHash, err := ParseTokenHash(req.NextAssignTokenSHA256)
		if err != nil {
			writeError(w, errf(http.StatusBadRequest, api.CodeBadRequest, "a re-assignment needs next_assign_token_sha256: %v", err))
			return
		}
		if !old.assigned {
			writeError(w, errf(http.StatusConflict, api.CodeConflict, "this sandbox is not assigned yet: assign it"))
			return
		}
		next = &access{hashes: hashes, allowUnauth: req.AllowUnauthenticated, env: old.env, dir: old.dir, assigned: true, assignHash: &nextHash}
	case old.assigned:
		writeError(w, errf(http.StatusConflict, api.CodeConflict, "this sandbox is assigned already"))
		return
	default:
		next = &access{hashes: hashes, allowUnauth: req.AllowUnauthenticated, env: mergeEnvList(old.env, req.Env), dir: old.dir, assigned: true, assignHash: old.assignHash}
		if req.Dir != "" {
			next.dir = req.Dir
		}
	}
	if !s.access.CompareAndSwap(old, next) {
		writeError(w, errf(http.StatusConflict, api.CodeConflict, "this sandbox's assignment changed meanwhile"))
		return
	}
	s.touch()
	if len(req.Main) > 0 {
		s.assignMain <- mainSpec{argv: req.Main, restartPolicy: req.RestartPolicy}
	}
	writeJSON(w, http.StatusOK, api.Health{Status: "ok", Version: s.cfg.Version})
}

// mergeEnvList sets KEY=VALUE entries of extra over base.
func mergeEnvList(base, extra []string) []string {
	if len(extra) == 0 {
		return base
	}
	m := make(map[string]string, len(extra))
	for _, kv := range extra {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return mergeEnv(base, m)
}

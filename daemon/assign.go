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
// assign token as bearer. It works once.
func (s *Server) assign(w http.ResponseWriter, r *http.Request) {
	if s.cfg.AssignTokenHash == nil {
		writeError(w, errf(http.StatusNotFound, api.CodeNotFound, "this sandbox is not waiting for an assignment"))
		return
	}
	tok, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	sum := sha256.Sum256([]byte(tok))
	if subtle.ConstantTimeCompare(sum[:], s.cfg.AssignTokenHash[:]) != 1 {
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
	old := s.access.Load()
	if old.assigned {
		writeError(w, errf(http.StatusConflict, api.CodeConflict, "this sandbox is assigned already"))
		return
	}
	next := &access{allowUnauth: req.AllowUnauthenticated, env: mergeEnvList(old.env, req.Env), dir: old.dir, assigned: true}
	if req.Dir != "" {
		next.dir = req.Dir
	}
	for _, h := range req.TokenHashes {
		sum, err := ParseTokenHash(h)
		if err != nil {
			writeError(w, errf(http.StatusBadRequest, api.CodeBadRequest, "%v", err))
			return
		}
		next.hashes = append(next.hashes, sum)
	}
	if !s.access.CompareAndSwap(old, next) {
		writeError(w, errf(http.StatusConflict, api.CodeConflict, "this sandbox is assigned already"))
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

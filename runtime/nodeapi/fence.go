package nodeapi

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"

	"github.com/containerd/errdefs"
)

// HeaderLeaderEpoch carries the epoch of the elected sandman-vk that makes a
// call (its Lease's leaseTransitions + 1: it grows with every change of
// leader). A virtual node without leader election sends none.
const HeaderLeaderEpoch = "Sandman-Leader-Epoch"

// ErrStaleLeader: a mutating call came from a leader older than the newest
// this agent has seen (or without an epoch once it has seen one). It is a
// conflict (HTTP 409, code stale_leader).
var ErrStaleLeader error = staleLeader{}

type staleLeader struct{}

func (staleLeader) Error() string { return "stale leader" }
func (staleLeader) Unwrap() error { return errdefs.ErrConflict }

// fence remembers the highest leader epoch seen in memory only: an agent
// that restarts forgets it, and the first epoch it is then sent becomes
// the highest (a deposed leader could slip one call in only if it calls
// that agent first, and it stops placing before its Lease can be taken).
type fence struct {
	// mu guards highest.
	mu      sync.Mutex
	highest uint64
}

// admit checks a mutating call's epoch (0: none given) and raises the
// highest seen. A call without an epoch passes only while the agent has
// never seen one (a single virtual node without leader election, local
// tools); once an elected leader has called, it is refused as stale.
func (f *fence) admit(epoch uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if epoch < f.highest {
		if epoch == 0 {
			return fmt.Errorf("%w: epoch 0 < %d: the call carries no %s header, and this node agent follows an elected sandman-vk; "+
				"only the current leader may change its slots (restart the agent to serve a virtual node without leader election)",
				ErrStaleLeader, f.highest, HeaderLeaderEpoch)
		}
		return fmt.Errorf("%w: epoch %d < %d: a newer sandman-vk leads; this one must stop", ErrStaleLeader, epoch, f.highest)
	}
	f.highest = epoch
	return nil
}

// current is the highest epoch seen (0: none).
func (f *fence) current() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.highest
}

// leaderEpoch reads a request's epoch header: 0 when absent.
func leaderEpoch(r *http.Request) (uint64, error) {
	v := r.Header.Get(HeaderLeaderEpoch)
	if v == "" {
		return 0, nil
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil || n == 0 {
		return 0, errors.New(HeaderLeaderEpoch + ": want a positive integer, got " + strconv.Quote(v))
	}
	return n, nil
}

// fenced admits a mutating call only from the current leader (see admit).
func (s *Server) fenced(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		epoch, err := leaderEpoch(r)
		if err != nil {
			writeError(w, err, http.StatusBadRequest, "invalid_argument")
			return
		}
		if err := s.fence.admit(epoch); err != nil {
			s.log.Warn("refused a call from a stale leader", "path", r.URL.Path, "remote", r.RemoteAddr, "err", err)
			writeErr(w, err)
			return
		}
		h(w, r)
	}
}

// leaderAnswer is what POST /v1/leader answers.
type leaderAnswer struct {
	Epoch uint64 `json:"epoch"`
}

// leader records the caller's epoch (fenced already): a new leader calls it
// on taking over, so a deposed one is refused from then on, before the new
// one's first bind.
func (s *Server) leader(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, leaderAnswer{Epoch: s.fence.current()})
}

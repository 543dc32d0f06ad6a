package nodeapi_test

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime/nodeapi"
)

// TestFencing: mutating calls of a leader older than the newest the agent
// has seen are refused (409, "stale leader: epoch N < M"); equal and newer
// epochs pass and the highest is remembered; calls without an epoch pass
// only until an elected leader has called.
func TestFencing(t *testing.T) {
	_, url := serve(t)
	client := func(epoch uint64) *nodeapi.Client {
		return nodeapi.NewClient(url, "pool-secret", nil).WithLeaderEpoch(func() uint64 { return epoch })
	}
	steps := []struct {
		name  string
		epoch uint64
		// stale: want the call refused, with this in the message.
		stale string
	}{
		{name: "no epoch before any leader", epoch: 0},
		{name: "first leader", epoch: 3},
		{name: "same leader again", epoch: 3},
		{name: "older leader", epoch: 2, stale: "stale leader: epoch 2 < 3"},
		{name: "no epoch once a leader called", epoch: 0, stale: "stale leader: epoch 0 < 3"},
		{name: "newer leader", epoch: 7},
		{name: "the deposed leader", epoch: 3, stale: "stale leader: epoch 3 < 7"},
		{name: "the newest again", epoch: 7},
	}
	for _, st := range steps {
		t.Run(st.name, func(t *testing.T) {
			c := client(st.epoch)
			// A release of an unknown pod is a no-op that is still fenced.
			err := c.Release(t.Context(), "nobody", 0)
			if st.stale == "" {
				if err != nil {
					t.Fatalf("release: %v", err)
				}
				return
			}
			if !errors.Is(err, nodeapi.ErrStaleLeader) || !errdefs.IsConflict(err) || !strings.Contains(err.Error(), st.stale) {
				t.Fatalf("release: err = %v, want a stale leader conflict saying %q", err, st.stale)
			}
			if err := c.Claim(t.Context()); !errors.Is(err, nodeapi.ErrStaleLeader) {
				t.Errorf("claim: err = %v, want stale leader", err)
			}
			if err := c.Drain(t.Context(), "test"); !errors.Is(err, nodeapi.ErrStaleLeader) {
				t.Errorf("drain: err = %v, want stale leader", err)
			}
			// Reads are not fenced: a standby watches every agent.
			if _, err := c.Inventory(t.Context()); err != nil {
				t.Errorf("inventory: %v", err)
			}
		})
	}
}

// TestFencingClaim: a new leader's claim raises the epoch before its first
// bind, and the wire answer is HTTP 409 with code stale_leader.
func TestFencingClaim(t *testing.T) {
	_, url := serve(t)
	if err := nodeapi.NewClient(url, "pool-secret", nil).WithLeaderEpoch(func() uint64 { return 5 }).Claim(t.Context()); err != nil {
		t.Fatalf("claim: %v", err)
	}
	for _, tc := range []struct {
		name, epoch string
		status      int
		body        string
	}{
		{"stale", "4", http.StatusConflict, `"code":"stale_leader","message":"stale leader: epoch 4 \u003c 5`},
		{"none", "", http.StatusConflict, `"code":"stale_leader"`},
		{"malformed", "x", http.StatusBadRequest, `"code":"invalid_argument"`},
		{"current", "5", http.StatusOK, `{"uid":"nobody"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+"/v1/release", strings.NewReader(`{"uid":"nobody"}`))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer pool-secret")
			if tc.epoch != "" {
				req.Header.Set(nodeapi.HeaderLeaderEpoch, tc.epoch)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var b strings.Builder
			_, _ = io.Copy(&b, resp.Body)
			if resp.StatusCode != tc.status || !strings.Contains(b.String(), tc.body) {
				t.Fatalf("answer %d %s, want %d with %s", resp.StatusCode, b.String(), tc.status, tc.body)
			}
		})
	}
}

package runtime

import (
	"encoding/hex"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
)

// FuzzValidate: Validate accepts only requests a node agent can run (a
// pod, named containers with images, resources that are not negative and
// whose sum does not wrap, limits a sandbox can live in, a known restart
// policy, well-formed token hashes or explicit unauthenticated mode), and
// refuses the rest as InvalidArgument naming the pod.
func FuzzValidate(f *testing.F) {
	hash := strings.Repeat("ab", 32)
	type seed struct {
		uid, name, name2, image string
		reqCPU, reqMem          int64
		limCPU, limMem          int64
		exclusive               int
		disk                    int64
		restart, hashes         string
		unauth                  bool
		n                       uint8
	}
	for _, s := range []seed{
		{"uid-1", "main", "side", "busybox", 100, 64 << 20, 1000, 128 << 20, 1, 1 << 30, "Never", hash, false, 1},
		{"uid-2", "a", "b", "img", 0, 0, 0, 0, 0, 0, "", "", true, 2},
		{"uid-3", "a", "a", "img", 0, 0, 0, 0, 0, 0, "Always", hash, false, 2},                   // duplicate names
		{"", "a", "b", "img", 0, 0, 0, 0, 0, 0, "", hash, false, 1},                              // no UID
		{"uid-4", "a", "b", "", 0, 0, 0, 0, 0, 0, "", hash, false, 1},                            // no image
		{"uid-5", "a", "b", "img", -1, 0, 0, 0, 0, 0, "", hash, false, 1},                        // negative request
		{"uid-6", "a", "b", "img", 0, 0, 5, 1 << 20, 0, 0, "", hash, false, 1},                   // limits too small
		{"uid-7", "a", "b", "img", math.MaxInt64, math.MaxInt64, 0, 0, 0, 0, "", hash, false, 2}, // sum wraps
		{"uid-8", "a", "b", "img", 0, 0, 0, 0, -2, 0, "OnFailure", hash, false, 1},               // negative exclusive CPUs
		{"uid-8b", "a", "b", "img", 0, 0, 0, 0, 0, -1, "", hash, false, 1},                       // negative disk limit
		{"uid-9", "a", "b", "img", 0, 0, 0, 0, 0, 0, "Sometimes", hash, false, 1},                // unknown restart policy
		{"uid-10", "a", "b", "img", 0, 0, 0, 0, 0, 0, "", "zz," + hash, false, 1},                // malformed hash
		{"uid-11", "a", "b", "img", 0, 0, 0, 0, 0, 0, "", "", false, 1},                          // no hash, auth required
		{"uid-12", "a", "b", "img", 0, 0, 0, 0, 0, 0, "", strings.ToUpper(hash) + "," + hash, false, 3},
		{"uid-13", "a", "b", "img", 0, 0, 0, 0, 0, 0, "", " " + hash, false, 1},
		{"uid-14", "a", "b", "img", 0, 0, 0, 0, 0, 0, "", "", false, 0}, // no containers
	} {
		f.Add(s.uid, s.name, s.name2, s.image, s.reqCPU, s.reqMem, s.limCPU, s.limMem, s.exclusive, s.disk, s.restart, s.hashes, s.unauth, s.n)
	}
	f.Fuzz(func(t *testing.T, uid, name, name2, image string, reqCPU, reqMem, limCPU, limMem int64, exclusive int, disk int64, restart, hashes string, unauth bool, n uint8) {
		req := BindRequest{Pod: PodRef{UID: uid, Namespace: "ns", Name: "pod"}, RestartPolicy: restart, AllowUnauthenticated: unauth}
		if hashes != "" {
			req.TokenHashes = strings.Split(hashes, ",")
		}
		// Up to three containers: the first with every fuzzed value, the
		// others with the same requests (so sums can wrap) and their own name.
		for i := range int(n % 4) {
			c := ContainerSpec{Name: name, Image: image,
				Requests: Resources{MilliCPU: reqCPU, MemoryBytes: reqMem}}
			if i == 0 {
				c.Limits = Resources{MilliCPU: limCPU, MemoryBytes: limMem}
				c.ExclusiveCPUs, c.DiskBytes = exclusive, disk
			} else {
				c.Name = name2 + strings.Repeat("'", i-1)
			}
			req.Containers = append(req.Containers, c)
		}

		err := req.Validate()
		if err != nil {
			if !errdefs.IsInvalidArgument(err) {
				t.Fatalf("Validate(%+v) = %v: want an InvalidArgument error", req, err)
			}
			if !strings.HasPrefix(err.Error(), "bind ") && !strings.HasPrefix(err.Error(), "bind:") || !strings.Contains(err.Error(), uid) {
				t.Fatalf("Validate error %q does not name the pod %q", err, uid)
			}
			ev := InvalidSpecEvent(req, err, time.Unix(1, 0))
			if ev.Type != EventBindFailed || ev.Reason != ReasonInvalidSpec || ev.Message != err.Error() || ev.Slot.Pod == nil || *ev.Slot.Pod != req.Pod {
				t.Fatalf("InvalidSpecEvent = %+v: want a bind_failed InvalidSpec event naming the pod", ev)
			}
			return
		}
		if req.Pod.UID == "" || len(req.Containers) == 0 {
			t.Fatalf("accepted a request without a pod UID or containers: %+v", req)
		}
		seen := map[string]bool{}
		var sum Resources
		for _, c := range req.Containers {
			if c.Name == "" || c.Image == "" || seen[c.Name] {
				t.Fatalf("accepted container %+v (empty or duplicate name, or no image)", c)
			}
			seen[c.Name] = true
			for _, v := range []int64{c.Requests.MilliCPU, c.Requests.MemoryBytes, c.Limits.MilliCPU, c.Limits.MemoryBytes, c.DiskBytes, int64(c.ExclusiveCPUs)} {
				if v < 0 {
					t.Fatalf("accepted a negative resource value in %+v", c)
				}
			}
			if c.Limits.MemoryBytes != 0 && c.Limits.MemoryBytes < 4<<20 || c.Limits.MilliCPU != 0 && c.Limits.MilliCPU < 10 {
				t.Fatalf("accepted limits %+v a sandbox cannot run in", c.Limits)
			}
			sum = sum.Add(c.Requests)
			if sum.MilliCPU < c.Requests.MilliCPU || sum.MemoryBytes < c.Requests.MemoryBytes {
				t.Fatalf("accepted requests whose sum wraps: %+v", req.Containers)
			}
		}
		if got := req.Requests(); got != sum || got.MilliCPU < 0 || got.MemoryBytes < 0 {
			t.Fatalf("Requests() = %+v, want %+v", got, sum)
		}
		switch req.RestartPolicy {
		case "", "Never", "OnFailure", "Always":
		default:
			t.Fatalf("accepted restart policy %q", req.RestartPolicy)
		}
		if len(req.TokenHashes) == 0 && !req.AllowUnauthenticated {
			t.Fatal("accepted a request with neither a token hash nor unauthenticated mode")
		}
		for _, h := range req.TokenHashes {
			// What the daemon's --token-sha256 takes: 64 hex digits
			// (surrounding space is trimmed).
			if b, err := hex.DecodeString(strings.TrimSpace(h)); err != nil || len(b) != 32 {
				t.Fatalf("accepted token hash %q, which the daemon refuses", h)
			}
		}
	})
}

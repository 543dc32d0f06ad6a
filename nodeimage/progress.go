package nodeimage

import (
	"context"
	"sync"

	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/remotes"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// tracker measures a pull's progress as containerd's ctr does: the
// descriptors the pull walks give the total, and each one counts as done
// once its content is stored, or by its ingest's offset while it streams.
type tracker struct {
	store content.Store

	mu       sync.Mutex
	descs    []ocispec.Descriptor
	complete map[string]bool // by digest
}

func newTracker(store content.Store) *tracker {
	return &tracker{store: store, complete: map[string]bool{}}
}

// handler records every descriptor the pull visits.
func (t *tracker) handler() images.Handler {
	return images.HandlerFunc(func(ctx context.Context, desc ocispec.Descriptor) ([]ocispec.Descriptor, error) {
		t.mu.Lock()
		t.descs = append(t.descs, desc)
		t.mu.Unlock()
		return nil, nil
	})
}

// progress returns bytes done and known in total.
func (t *tracker) progress(ctx context.Context) (done, total int64) {
	t.mu.Lock()
	descs := append([]ocispec.Descriptor(nil), t.descs...)
	t.mu.Unlock()
	if len(descs) == 0 {
		return 0, 0
	}
	active := map[string]int64{}
	if statuses, err := t.store.ListStatuses(ctx); err == nil {
		for _, st := range statuses {
			active[st.Ref] = st.Offset
		}
	}
	seen := map[string]bool{}
	for _, d := range descs {
		key := d.Digest.String()
		if seen[key] {
			continue
		}
		seen[key] = true
		total += d.Size
		t.mu.Lock()
		ok := t.complete[key]
		t.mu.Unlock()
		if !ok {
			if off, streaming := active[remotes.MakeRefKey(ctx, d)]; streaming {
				done += off
				continue
			}
			if _, err := t.store.Info(ctx, d.Digest); err != nil {
				continue
			}
			t.mu.Lock()
			t.complete[key] = true
			t.mu.Unlock()
		}
		done += d.Size
	}
	return done, total
}

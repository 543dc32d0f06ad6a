package nodeimage

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"syscall"
	"time"

	"github.com/containerd/platforms"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
)

// Usage is the image cache's size.
type Usage struct {
	Images int
	// Bytes on disk: the images' content and unpacked layers, plus the lazy
	// cache.
	Bytes int64
	// LazyBytes of Bytes are the lazy-pulling snapshotter's cache of what
	// sandboxes read from lazily pulled layers (Config.LazyCacheDir), as
	// last measured.
	LazyBytes int64
	// LazyImages of Images have layers mounted lazily.
	LazyImages int
	Budget     int64
	Pulling    int
}

// Usage returns the cache's size as last measured (images pulled since the
// last GC count 0 until it measures them).
func (m *Manager) Usage(context.Context) Usage {
	m.mu.Lock()
	defer m.mu.Unlock()
	u := Usage{Images: len(m.images), Budget: m.cfg.CacheBytes, Pulling: len(m.pulls), LazyBytes: m.lazyBytes}
	u.Bytes = u.LazyBytes
	for _, e := range m.images {
		u.Bytes += e.size
		if len(e.lazyLayers) > 0 {
			u.LazyImages++
		}
	}
	return u
}

// inUse is the set of images that slots or containers use now.
func (m *Manager) inUse(ctx context.Context) map[string]bool {
	ctx = m.ns(ctx)
	out := map[string]bool{}
	for _, ref := range m.cfg.InUse() {
		if name, err := Normalize(ref); err == nil {
			out[name] = true
		}
	}
	if cs, err := m.cfg.Client.ContainerService().List(ctx); err == nil {
		for _, c := range cs {
			if c.Image != "" {
				out[c.Image] = true
			}
		}
	}
	return out
}

// GC measures cached images and, when they exceed the budget, removes the
// least recently used images that no slot or container uses, are not pinned
// and are not being pulled, until usage is within budget (or nothing more
// may go). It returns the images it removed.
func (m *Manager) GC(ctx context.Context) ([]string, error) {
	ctx = m.ns(ctx)
	m.measure(ctx)
	if m.cfg.CacheBytes <= 0 {
		return nil, nil
	}
	u := m.Usage(ctx)
	if u.Bytes <= m.cfg.CacheBytes {
		return nil, nil
	}
	inUse := m.inUse(ctx)
	type cand struct {
		name     string
		size     int64
		lastUsed time.Time
	}
	var cands []cand
	m.mu.Lock()
	for name, e := range m.images {
		if inUse[name] || m.pinned[name] || m.pulls[name] != nil {
			continue
		}
		cands = append(cands, cand{name, e.size + m.lazyShareLocked(e), e.lastUsed})
	}
	m.mu.Unlock()
	slices.SortFunc(cands, func(a, b cand) int { return a.lastUsed.Compare(b.lastUsed) })
	var removed []string
	var errs []error
	over := u.Bytes - m.cfg.CacheBytes
	for _, c := range cands {
		if over <= 0 {
			break
		}
		m.mu.Lock()
		e, ok := m.images[c.name]
		if !ok || !e.lastUsed.Equal(c.lastUsed) {
			// Gone, or used since we looked.
			m.mu.Unlock()
			continue
		}
		delete(m.images, c.name)
		m.mu.Unlock()
		if err := m.cfg.Client.ImageService().Delete(ctx, c.name, images.SynchronousDelete()); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove image %s: %w", c.name, err))
			m.mu.Lock()
			m.images[c.name] = e
			m.mu.Unlock()
			continue
		}
		over -= c.size
		removed = append(removed, c.name)
		m.metrics.gcRemoved.Inc()
		m.cfg.Logger.Info("image removed for the disk budget", "image", c.name, "bytes", c.size, "last_used", c.lastUsed)
	}
	if len(removed) > 0 {
		m.cfg.OnChange()
	}
	if over > 0 && len(errs) == 0 {
		m.cfg.Logger.Warn("image cache over budget: the rest is in use or pinned", "over_bytes", over)
	}
	return removed, errors.Join(errs...)
}

// lazyShareLocked estimates what removing lazy image e frees of the lazy
// cache: what the snapshotter fetched on demand for its layers, twice (the
// compressed chunks and the files' decompressed ones are both cached), or,
// with no such figures, all its lazily mounted layers, so that one pass
// never removes more images than it has to (the next pass measures again).
func (m *Manager) lazyShareLocked(e *entry) int64 {
	var fetched, whole int64
	for _, l := range e.lazyLayers {
		fetched += m.lazyFetched[l.Digest.String()]
		whole += l.Size
	}
	if fetched > 0 {
		return min(2*fetched, m.lazyBytes)
	}
	return min(whole, m.lazyBytes)
}

// measure sizes the images not measured yet: content plus unpacked
// snapshots (layers shared between images count once per image), and which
// of their layers are mounted lazily (not in the content store). The lazy
// cache is measured anew every time: it grows as sandboxes read.
func (m *Manager) measure(ctx context.Context) {
	if m.cfg.LazyCacheDir != "" {
		size := dirSize(m.cfg.LazyCacheDir)
		fetched := m.lazyFetchedByLayer()
		m.mu.Lock()
		m.lazyBytes, m.lazyFetched = size, fetched
		m.mu.Unlock()
	}
	m.mu.Lock()
	var todo []string
	for name, e := range m.images {
		if e.size == 0 {
			todo = append(todo, name)
		}
	}
	m.mu.Unlock()
	for _, name := range todo {
		img, err := m.cfg.Client.GetImage(ctx, name)
		if err != nil {
			if errdefs.IsNotFound(err) {
				m.mu.Lock()
				delete(m.images, name)
				m.mu.Unlock()
			}
			continue
		}
		size, err := img.Usage(ctx, ctrd.WithSnapshotUsage())
		if err != nil || size == 0 {
			continue
		}
		var lazy []ocispec.Descriptor
		if m.cfg.LazyPull {
			if mf, err := images.Manifest(ctx, m.cfg.Client.ContentStore(), img.Target(), platforms.Default()); err == nil {
				for _, l := range mf.Layers {
					if _, err := m.cfg.Client.ContentStore().Info(ctx, l.Digest); errdefs.IsNotFound(err) {
						lazy = append(lazy, l)
					}
				}
			}
		}
		m.mu.Lock()
		if e, ok := m.images[name]; ok {
			e.size, e.lazyLayers = size, lazy
		}
		m.mu.Unlock()
	}
}

// dirSize is the disk used by the files under dir (0 when it cannot be
// read).
func dirSize(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if info, err := d.Info(); err == nil && info.Mode().IsRegular() {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			} else {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}

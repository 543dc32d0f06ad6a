package nodeimage

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
)

// Usage is the image cache's size.
type Usage struct {
	Images  int
	Bytes   int64
	Budget  int64
	Pulling int
}

// Usage returns the cache's size as last measured (images pulled since the
// last GC count 0 until it measures them).
func (m *Manager) Usage(context.Context) Usage {
	m.mu.Lock()
	defer m.mu.Unlock()
	u := Usage{Images: len(m.images), Budget: m.cfg.CacheBytes, Pulling: len(m.pulls)}
	for _, e := range m.images {
		u.Bytes += e.size
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
		cands = append(cands, cand{name, e.size, e.lastUsed})
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

// measure sizes the images not measured yet: content plus unpacked
// snapshots. Layers shared between images count once per image.
func (m *Manager) measure(ctx context.Context) {
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
		m.mu.Lock()
		if e, ok := m.images[name]; ok {
			e.size = size
		}
		m.mu.Unlock()
	}
}

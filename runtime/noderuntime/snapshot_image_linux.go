package noderuntime

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/errdefs"
	"github.com/distribution/reference"
	"github.com/klauspost/compress/gzip"
	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/sandman-dev/sandman/runtime"
)

// Committing a snapshot (steps 3 and 4 in snapshot_linux.go): its layer,
// config and manifest in the content store, its image record, the push.

// writeLayer turns the uncompressed changes in f into the snapshot's
// layer in the content store: owners as the sandbox saw them (idBase),
// gzipped. It returns the layer's descriptor, its diff ID (digest of the
// uncompressed tar) and its uncompressed size.
func (r *Runtime) writeLayer(ctx context.Context, f *os.File, idBase uint32) (ocispec.Descriptor, digest.Digest, int64, error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return ocispec.Descriptor{}, "", 0, err
	}
	cs := r.client.ContentStore()
	ref := "sandman-snapshot-layer-" + randomHex()
	cw, err := content.OpenWriter(ctx, cs, content.WithRef(ref))
	if err != nil {
		return ocispec.Descriptor{}, "", 0, err
	}
	committed := false
	defer func() {
		cw.Close()
		if !committed {
			_ = cs.Abort(context.WithoutCancel(ctx), ref)
		}
	}()
	compressed := &countWriter{w: cw}
	gz, err := gzip.NewWriterLevel(compressed, gzip.BestSpeed)
	if err != nil {
		return ocispec.Descriptor{}, "", 0, err
	}
	diffID := digest.SHA256.Digester()
	uncompressed := &countWriter{w: io.MultiWriter(gz, diffID.Hash())}
	if err := unmapLayer(uncompressed, bufio.NewReaderSize(f, 1<<20), idBase); err != nil {
		return ocispec.Descriptor{}, "", 0, err
	}
	if err := gz.Close(); err != nil {
		return ocispec.Descriptor{}, "", 0, err
	}
	dgst := cw.Digest()
	labels := map[string]string{"containerd.io/uncompressed": diffID.Digest().String()}
	if err := cw.Commit(ctx, compressed.n, dgst, content.WithLabels(labels)); err != nil {
		if !errdefs.IsAlreadyExists(err) {
			return ocispec.Descriptor{}, "", 0, fmt.Errorf("commit: %w", err)
		}
		if _, err := cs.Update(ctx, content.Info{Digest: dgst, Labels: labels}, "labels.containerd.io/uncompressed"); err != nil {
			return ocispec.Descriptor{}, "", 0, err
		}
	}
	committed = true
	return ocispec.Descriptor{MediaType: ocispec.MediaTypeImageLayerGzip, Digest: dgst, Size: compressed.n}, diffID.Digest(), uncompressed.n, nil
}

// writeSnapshotImage writes the snapshot's config and manifest: the base
// image's config (every field kept) with the new diff ID and a history
// entry, and an OCI manifest of the base's layers (Docker media types
// become their OCI equivalents: the same bytes) and the new one. The
// manifest carries containerd's GC labels for its children.
func (r *Runtime) writeSnapshotImage(ctx context.Context, baseName string, layer ocispec.Descriptor, diffID digest.Digest, createdBy string) (ocispec.Descriptor, error) {
	cs := r.client.ContentStore()
	base, err := r.client.GetImage(ctx, baseName)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("base image %s: %w", baseName, err)
	}
	manifest, err := images.Manifest(ctx, cs, base.Target(), base.Platform())
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("manifest of %s: %w", baseName, err)
	}
	raw, err := content.ReadBlob(ctx, cs, manifest.Config)
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("config of %s: %w", baseName, err)
	}
	config, err := snapshotConfig(raw, diffID, len(manifest.Layers), createdBy, time.Now().UTC())
	if err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("config of %s: %w", baseName, err)
	}
	configDesc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageConfig, Digest: digest.FromBytes(config), Size: int64(len(config))}
	if err := content.WriteBlob(ctx, cs, "sandman-snapshot-config-"+randomHex(), bytes.NewReader(config), configDesc); err != nil {
		return ocispec.Descriptor{}, err
	}
	m := ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    configDesc,
		Annotations: map[string]string{
			ocispec.AnnotationBaseImageName:   baseName,
			ocispec.AnnotationBaseImageDigest: base.Target().Digest.String(),
		},
	}
	for _, l := range manifest.Layers {
		if l.MediaType == images.MediaTypeDockerSchema2LayerGzip {
			l.MediaType = ocispec.MediaTypeImageLayerGzip
		}
		m.Layers = append(m.Layers, l)
	}
	m.Layers = append(m.Layers, layer)
	b, err := json.Marshal(m)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	labels := map[string]string{"containerd.io/gc.ref.content.config": configDesc.Digest.String()}
	for i, l := range m.Layers {
		labels["containerd.io/gc.ref.content.l."+strconv.Itoa(i)] = l.Digest.String()
	}
	desc := ocispec.Descriptor{MediaType: ocispec.MediaTypeImageManifest, Digest: digest.FromBytes(b), Size: int64(len(b))}
	if err := content.WriteBlob(ctx, cs, "sandman-snapshot-manifest-"+randomHex(), bytes.NewReader(b), desc, content.WithLabels(labels)); err != nil {
		return ocispec.Descriptor{}, err
	}
	return desc, nil
}

// recordImage creates (or points) the image record name at target. undo
// puts back what was there: no record, or the previous one.
func (r *Runtime) recordImage(ctx context.Context, name string, target ocispec.Descriptor) (undo func(context.Context) error, _ error) {
	is := r.client.ImageService()
	rec := images.Image{Name: name, Target: target}
	old, err := is.Get(ctx, name)
	switch {
	case errdefs.IsNotFound(err):
		if _, err := is.Create(ctx, rec); err != nil {
			return nil, err
		}
		return func(ctx context.Context) error {
			if err := is.Delete(ctx, name, images.SynchronousDelete()); err != nil && !errdefs.IsNotFound(err) {
				return err
			}
			return nil
		}, nil
	case err != nil:
		return nil, err
	}
	if _, err := is.Update(ctx, rec, "target", "labels"); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		_, err := is.Update(ctx, old, "target", "labels")
		return err
	}, nil
}

// adoptByDigest records the snapshot's image under its digest too
// (<repository>@<digest>, how forks pin it: `IMAGE@DIGEST` normalizes to
// that), so a fork named so on this node finds it here and pulls nothing.
// The alias is an image record of its own for the cache (its LRU and
// placement); a failure only costs that fork a pull, so it is logged.
func (r *Runtime) adoptByDigest(ctx context.Context, name string, manifest ocispec.Descriptor) {
	named, err := reference.ParseNormalizedNamed(name)
	if err != nil {
		return
	}
	alias := named.Name() + "@" + manifest.Digest.String()
	if _, err := r.recordImage(ctx, alias, manifest); err != nil {
		r.log.Warn("record a snapshot's image by digest", "image", alias, "err", err)
		return
	}
	if err := r.images.Adopt(ctx, alias); err != nil {
		r.log.Warn("adopt a snapshot's image by digest", "image", alias, "err", err)
	}
}

// pushSnapshot pushes the image to the snapshot registry, reporting the
// bytes sent (the new layer is most of them; blobs the registry has are
// counted as sent).
func (r *Runtime) pushSnapshot(ctx context.Context, name string, manifest, layer ocispec.Descriptor, auth [][]byte, progress func(runtime.SnapshotProgress)) error {
	cs := r.client.ContentStore()
	m, err := images.Manifest(ctx, cs, manifest, nil)
	if err != nil {
		return err
	}
	descs := append([]ocispec.Descriptor{manifest, m.Config}, m.Layers...)
	var total int64
	for _, d := range descs {
		total += d.Size
	}
	tracker := docker.NewInMemoryTracker()
	report := func() {
		var done int64
		for _, d := range descs {
			if st, err := tracker.GetStatus(remotes.MakeRefKey(ctx, d)); err == nil {
				done += min(st.Offset, d.Size)
			}
		}
		progress(runtime.SnapshotProgress{Phase: runtime.SnapshotPush, BytesDone: done, BytesTotal: total})
	}
	report()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				report()
			}
		}
	})
	err = r.client.Push(ctx, name, manifest, ctrd.WithResolver(r.images.Resolver(ctx, auth, tracker)))
	close(stop)
	wg.Wait()
	if err != nil {
		return pushError(r.cfg.SnapshotRegistry, name, err)
	}
	progress(runtime.SnapshotProgress{Phase: runtime.SnapshotPush, BytesDone: total, BytesTotal: total})
	return nil
}

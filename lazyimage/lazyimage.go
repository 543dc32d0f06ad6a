// Package lazyimage converts ordinary OCI images into eStargz, the format the
// node agents' lazy-pulling snapshotter (stargz-snapshotter) mounts before the
// pull ends. Every layer is rebuilt as an eStargz blob: the same
// files in a gzip stream of per-file chunks with a table of contents, the
// prioritized files (what a task reads first) at the front followed by the
// prefetch landmark, and the TOC's digest in the layer descriptor's
// annotation, which the snapshotter verifies. Layers already in eStargz are
// kept as they are. The config is kept but for the new diff IDs, so the image
// runs exactly as before; a snapshotter that cannot mount a layer lazily
// unpacks it as an ordinary gzip layer.
//
// It reads and writes registries with go-containerregistry; the caller gives
// the credentials and transport (remote.Option).
package lazyimage

import (
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// TOCDigestAnnotation is the layer annotation the snapshotter needs to mount
// a layer lazily: the digest of its eStargz table of contents.
const TOCDigestAnnotation = estargz.TOCJSONDigestAnnotation

// TagSuffix is appended to a source's tag to name its conversion when no
// target is given (stargz-snapshotter's convention: python:3.12-esgz).
const TagSuffix = "-esgz"

// Options of a conversion.
type Options struct {
	// Prioritized files (paths in the image, e.g. "usr/bin/python3") go
	// first in their layer, and the snapshotter fetches them, up to the
	// landmark, when it mounts the layer. Files absent from a layer are
	// skipped.
	Prioritized []string
	// Platform picks the manifest of a multi-platform source
	// (default linux/amd64).
	Platform *v1.Platform
	// Remote are go-containerregistry's options for reading the source and
	// writing the target: credentials (remote.WithAuthFromKeychain), the
	// transport, the context is set by Convert.
	Remote []remote.Option
	// Progress, when set, is called as layers are converted.
	Progress func(Progress)
	// TempDir holds the layer being converted, uncompressed, and the
	// converted layers until they are written (default os.TempDir()): room
	// for the largest layer uncompressed plus the whole image compressed.
	TempDir string
	// CompressionLevel of the new layers' gzip (default gzip.BestSpeed:
	// eStargz's own default, BestCompression, takes several times longer
	// for a few percent).
	CompressionLevel int
}

// Progress of one conversion: layers done of all, and the compressed bytes of
// the source's layers behind them.
type Progress struct {
	Layer, Layers int
	Done, Total   int64
}

// Result of a conversion.
type Result struct {
	// Target is where the image was written, with its digest.
	Target name.Digest
	// Layers of the image, of which Converted were rebuilt (the others were
	// eStargz already).
	Layers, Converted int
	// Bytes of the target's layers (compressed).
	Bytes int64
	// Already: every layer of the source was eStargz; nothing was written
	// when the source is the target.
	Already bool
	Took    time.Duration
}

// DefaultTarget names a conversion of src when the caller gives none: the same
// repository, tag + TagSuffix (a digest source gets tag "sha256-<hex>-esgz").
func DefaultTarget(src name.Reference) (name.Tag, error) {
	tag := ""
	switch r := src.(type) {
	case name.Tag:
		tag = r.TagStr()
	case name.Digest:
		h, err := v1.NewHash(r.DigestStr())
		if err != nil {
			return name.Tag{}, err
		}
		tag = h.Algorithm + "-" + h.Hex
	}
	if len(tag)+len(TagSuffix) > 128 {
		tag = tag[:128-len(TagSuffix)]
	}
	return src.Context().Tag(tag + TagSuffix), nil
}

// IsLazy says whether every layer of the manifest carries a TOC digest.
func IsLazy(m *v1.Manifest) bool {
	if len(m.Layers) == 0 {
		return false
	}
	for _, l := range m.Layers {
		if l.Annotations[TOCDigestAnnotation] == "" {
			return false
		}
	}
	return true
}

// Convert reads src, converts it and writes it as dst.
func Convert(ctx context.Context, src, dst name.Reference, o Options) (Result, error) {
	start := time.Now()
	ropts := append([]remote.Option{remote.WithContext(ctx)}, o.Remote...)
	platform := v1.Platform{OS: "linux", Architecture: "amd64"}
	if o.Platform != nil {
		platform = *o.Platform
	}
	img, err := remote.Image(src, append(ropts, remote.WithPlatform(platform))...)
	if err != nil {
		return Result{}, fmt.Errorf("read %s: %w", src, err)
	}
	m, err := img.Manifest()
	if err != nil {
		return Result{}, fmt.Errorf("read %s: %w", src, err)
	}
	if IsLazy(m) && src.Name() == dst.Name() {
		d, err := img.Digest()
		if err != nil {
			return Result{}, err
		}
		res := Result{Target: dst.Context().Digest(d.String()), Layers: len(m.Layers), Already: true, Took: time.Since(start)}
		for _, l := range m.Layers {
			res.Bytes += l.Size
		}
		return res, nil
	}
	c, err := Build(ctx, img, o)
	if err != nil {
		return Result{}, fmt.Errorf("convert %s: %w", src, err)
	}
	defer c.Close()
	if err := remote.Write(dst, c.Image, ropts...); err != nil {
		return Result{}, fmt.Errorf("write %s: %w", dst, err)
	}
	d, err := c.Image.Digest()
	if err != nil {
		return Result{}, err
	}
	res := c.Result
	res.Target = dst.Context().Digest(d.String())
	res.Took = time.Since(start)
	return res, nil
}

// Converted is an image Build made. Its new layers are files until Close.
type Converted struct {
	Image v1.Image
	// Result says what was converted (Target and Took are left to the
	// caller that writes it).
	Result Result
	dir    string
}

// Close removes the converted layers' files.
func (c *Converted) Close() error { return os.RemoveAll(c.dir) }

// Build converts img: every layer not eStargz already is rebuilt in
// o.TempDir, the config is kept but for the new diff IDs. The caller writes
// the result (remote.Write, or a containerd pusher) and closes it.
func Build(ctx context.Context, img v1.Image, o Options) (_ *Converted, err error) {
	if o.CompressionLevel == 0 {
		o.CompressionLevel = gzip.BestSpeed
	}
	m, err := img.Manifest()
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read its config: %w", err)
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	if len(layers) != len(m.Layers) {
		return nil, fmt.Errorf("%d layers, %d in its manifest", len(layers), len(m.Layers))
	}
	c := &Converted{Result: Result{Layers: len(layers), Already: IsLazy(m)}}
	if c.dir, err = os.MkdirTemp(o.TempDir, "lazyimage-"); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.Close()
		}
	}()
	var total int64
	for _, d := range m.Layers {
		total += d.Size
	}
	var adds []mutate.Addendum
	var done int64
	report := func(i int) {
		if o.Progress != nil {
			o.Progress(Progress{Layer: i, Layers: len(layers), Done: done, Total: total})
		}
	}
	report(0)
	for i, l := range layers {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		desc := m.Layers[i]
		if toc := desc.Annotations[TOCDigestAnnotation]; toc != "" {
			adds = append(adds, mutate.Addendum{Layer: l, MediaType: desc.MediaType, Annotations: desc.Annotations})
		} else {
			add, err := convertLayer(l, c.dir, i, o)
			if err != nil {
				return nil, fmt.Errorf("layer %d (%s): %w", i, desc.Digest, err)
			}
			adds = append(adds, add)
			c.Result.Converted++
		}
		done += desc.Size
		report(i + 1)
	}

	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	out, err := mutate.Append(base, adds...)
	if err != nil {
		return nil, err
	}
	ncf, err := out.ConfigFile()
	if err != nil {
		return nil, err
	}
	keep := cf.DeepCopy()
	keep.RootFS = ncf.RootFS // the new diff IDs; everything else as it was
	if out, err = mutate.ConfigFile(out, keep); err != nil {
		return nil, err
	}
	om, err := out.Manifest()
	if err != nil {
		return nil, err
	}
	for _, l := range om.Layers {
		c.Result.Bytes += l.Size
	}
	c.Image = out
	return c, nil
}

// convertLayer spools the layer's tar to a file (eStargz needs to read it
// twice), builds the eStargz blob into another and hands it over as a layer.
func convertLayer(l v1.Layer, dir string, i int, o Options) (mutate.Addendum, error) {
	rc, err := l.Uncompressed()
	if err != nil {
		return mutate.Addendum{}, err
	}
	defer rc.Close()
	tarPath := fmt.Sprintf("%s/%d.tar", dir, i)
	f, err := os.Create(tarPath)
	if err != nil {
		return mutate.Addendum{}, err
	}
	defer os.Remove(tarPath)
	defer f.Close()
	size, err := io.Copy(f, rc)
	if err != nil {
		return mutate.Addendum{}, fmt.Errorf("read: %w", err)
	}
	var missing []string
	blob, err := estargz.Build(io.NewSectionReader(f, 0, size),
		estargz.WithPrioritizedFiles(o.Prioritized),
		estargz.WithAllowPrioritizeNotFound(&missing),
		estargz.WithCompressionLevel(o.CompressionLevel))
	if err != nil {
		return mutate.Addendum{}, err
	}
	esgz := fmt.Sprintf("%s/%d.esgz", dir, i)
	g, err := os.Create(esgz)
	if err != nil {
		blob.Close()
		return mutate.Addendum{}, err
	}
	_, err = io.Copy(g, blob)
	err = errors.Join(err, blob.Close(), g.Close())
	if err != nil {
		return mutate.Addendum{}, err
	}
	nl, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return os.Open(esgz) }, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return mutate.Addendum{}, err
	}
	// The layer's digests are computed now, while its file exists.
	if _, err := nl.Digest(); err != nil {
		return mutate.Addendum{}, err
	}
	if _, err := nl.DiffID(); err != nil {
		return mutate.Addendum{}, err
	}
	return mutate.Addendum{Layer: nl, MediaType: types.OCILayer, Annotations: map[string]string{
		TOCDigestAnnotation: blob.TOCDigest().String(),
	}}, nil
}

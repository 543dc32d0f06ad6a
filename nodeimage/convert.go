package nodeimage

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/errdefs"
	"github.com/containerd/platforms"
	"github.com/distribution/reference"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/sandman-dev/sandman/lazyimage"
)

// LabelLazyFrom is set on an image a lazy node started from its pool's
// conversion (Config.ConvertRepository): the conversion's reference.
const LabelLazyFrom = "sandman.io/lazy-from"

// conversionRef names the conversion of name (whose registry serves
// manifest d) in the convert repository: the source's registry and path
// under it, tag "sha256-<hex>-esgz". Keyed by digest, a tag that moves gets
// a new conversion.
func (m *Manager) conversionRef(name string, d digest.Digest) (string, error) {
	named, err := reference.ParseNormalizedNamed(name)
	if err != nil {
		return "", err
	}
	host := strings.ToLower(strings.ReplaceAll(reference.Domain(named), ":", "-"))
	tag := d.Algorithm().String() + "-" + d.Encoded() + lazyimage.TagSuffix
	ref := m.cfg.ConvertRepository + "/" + host + "/" + reference.Path(named) + ":" + tag
	if _, err := reference.ParseNormalizedNamed(ref); err != nil {
		return "", err
	}
	return ref, nil
}

// lazySource says what a pull of name fetches on a node that converts
// (Config.ConvertRepository): pull, name's conversion when the pool's
// registry has it; else name, and convertTo where a conversion of it goes
// once it is pulled. A private image (one its registry does not serve
// anonymously) is never converted: the pool's registry would serve it to
// anyone.
func (m *Manager) lazySource(ctx context.Context, name string, creds map[string][2]string) (pull, convertTo string) {
	if !m.cfg.LazyPull || m.cfg.ConvertRepository == "" || strings.HasPrefix(name, m.cfg.ConvertRepository+"/") {
		return name, ""
	}
	var used atomic.Bool
	rctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	_, desc, err := m.resolver(rctx, creds, &used).Resolve(rctx, name)
	if err != nil {
		return name, "" // the pull says why
	}
	if used.Load() && m.check(rctx, name, nil) != nil {
		// The pod's credentials were asked for and the registry does not
		// answer without them: private, pulled whole with them. (Registries
		// ask for credentials of public images too, Docker Hub always.)
		return name, ""
	}
	ref, err := m.conversionRef(name, desc.Digest)
	if err != nil {
		m.cfg.Logger.Warn("lazy conversion: no name for it", "image", name, "err", err)
		return name, ""
	}
	_, _, err = m.newResolver(rctx, m.convertCreds(), nil, nil).Resolve(rctx, ref)
	switch {
	case err == nil:
		return ref, ""
	case errdefs.IsNotFound(err):
		return name, ref
	default:
		m.cfg.Logger.Warn("lazy conversion: the pool's registry does not answer; pulling the image whole", "image", name, "conversion", ref, "err", err)
		return name, ""
	}
}

// convertCreds are the credentials for the convert repository (none when
// ConvertSecrets is not set or fails).
func (m *Manager) convertCreds() map[string][2]string {
	if m.cfg.ConvertSecrets == nil {
		return nil
	}
	secrets, err := m.cfg.ConvertSecrets()
	if err != nil {
		m.cfg.Logger.Warn("lazy conversion: read the convert repository's credentials", "err", err)
		return nil
	}
	return parseDockerConfigs(secrets)
}

// adoptConversion records img, name's conversion pulled from ref, as name:
// binds of name use it, and the pool's name is not an image of the node.
func (m *Manager) adoptConversion(ctx context.Context, name, ref string, img ctrd.Image) (ctrd.Image, error) {
	is := m.cfg.Client.ImageService()
	rec := images.Image{Name: name, Target: img.Target(), Labels: map[string]string{LabelLazyFrom: ref}}
	out, err := is.Create(ctx, rec)
	if errdefs.IsAlreadyExists(err) {
		out, err = is.Update(ctx, rec, "target", "labels."+LabelLazyFrom)
	}
	if err != nil {
		return nil, fmt.Errorf("record the conversion %s as %s: %w", ref, name, err)
	}
	if err := is.Delete(ctx, ref); err != nil && !errdefs.IsNotFound(err) {
		m.cfg.Logger.Warn("lazy conversion: drop the pool's name", "image", ref, "err", err)
	}
	return ctrd.NewImage(m.cfg.Client, out), nil
}

// startConversion converts name (pulled whole as img) into eStargz in the
// background and pushes it as ref, so that the pool's next pulls of it are
// lazy. One conversion runs at a time on the node; one per image.
func (m *Manager) startConversion(name, ref string, img ctrd.Image) {
	m.mu.Lock()
	if m.converting[ref] {
		m.mu.Unlock()
		return
	}
	m.converting[ref] = true
	m.mu.Unlock()
	started := m.goManaged(func() {
		defer func() {
			m.mu.Lock()
			delete(m.converting, ref)
			m.mu.Unlock()
		}()
		ctx := m.ns(m.ctx)
		select {
		case m.convertSlot <- struct{}{}:
		case <-ctx.Done():
			return
		}
		defer func() { <-m.convertSlot }()
		begin := time.Now()
		res, err := m.convert(ctx, img, ref)
		switch {
		case errors.Is(err, errAlreadyLazy):
			m.metrics.conversions.WithLabelValues("skipped").Inc()
		case err != nil:
			m.metrics.conversions.WithLabelValues("failed").Inc()
			m.cfg.Logger.Warn("lazy conversion failed; the image keeps being pulled whole", "image", name, "conversion", ref, "err", err)
		default:
			m.metrics.conversions.WithLabelValues("ok").Inc()
			m.cfg.Logger.Info("lazy conversion pushed", "image", name, "conversion", ref,
				"layers", res.Layers, "converted", res.Converted, "bytes", res.Bytes, "seconds", time.Since(begin).Seconds())
		}
	})
	if !started {
		m.mu.Lock()
		delete(m.converting, ref)
		m.mu.Unlock()
	}
}

var errAlreadyLazy = errors.New("some layers are eStargz already")

// convert builds img's conversion from the node's content store (nothing is
// fetched again) and pushes it as ref with the convert repository's
// credentials and the node's registry settings.
func (m *Manager) convert(ctx context.Context, img ctrd.Image, ref string) (lazyimage.Result, error) {
	cs := m.cfg.Client.ContentStore()
	mf, err := images.Manifest(ctx, cs, img.Target(), platforms.Default())
	if err != nil {
		return lazyimage.Result{}, err
	}
	for _, l := range mf.Layers {
		if l.Annotations[lazyimage.TOCDigestAnnotation] != "" {
			return lazyimage.Result{}, errAlreadyLazy
		}
	}
	src, err := newContentImage(ctx, cs, mf)
	if err != nil {
		return lazyimage.Result{}, err
	}
	c, err := lazyimage.Build(ctx, src, lazyimage.Options{TempDir: m.cfg.ConvertDir})
	if err != nil {
		return lazyimage.Result{}, err
	}
	defer c.Close()
	pusher, err := m.newResolver(ctx, m.convertCreds(), nil, nil).Pusher(ctx, ref)
	if err != nil {
		return lazyimage.Result{}, err
	}
	layers, err := c.Image.Layers()
	if err != nil {
		return lazyimage.Result{}, err
	}
	om, err := c.Image.Manifest()
	if err != nil {
		return lazyimage.Result{}, err
	}
	for i, l := range layers {
		rc, err := l.Compressed()
		if err != nil {
			return lazyimage.Result{}, err
		}
		err = PushBlob(ctx, pusher, ociDescriptor(om.Layers[i]), rc)
		rc.Close()
		if err != nil {
			return lazyimage.Result{}, fmt.Errorf("push layer %d: %w", i, err)
		}
	}
	cfg, err := c.Image.RawConfigFile()
	if err != nil {
		return lazyimage.Result{}, err
	}
	if err := PushBlob(ctx, pusher, ociDescriptor(om.Config), strings.NewReader(string(cfg))); err != nil {
		return lazyimage.Result{}, fmt.Errorf("push config: %w", err)
	}
	raw, err := c.Image.RawManifest()
	if err != nil {
		return lazyimage.Result{}, err
	}
	desc := ocispec.Descriptor{MediaType: string(om.MediaType), Digest: digest.FromBytes(raw), Size: int64(len(raw))}
	if err := PushBlob(ctx, pusher, desc, strings.NewReader(string(raw))); err != nil {
		return lazyimage.Result{}, fmt.Errorf("push manifest: %w", err)
	}
	return c.Result, nil
}

func ociDescriptor(d v1.Descriptor) ocispec.Descriptor {
	return ocispec.Descriptor{MediaType: string(d.MediaType), Digest: digest.Digest(d.Digest.String()), Size: d.Size, Annotations: d.Annotations}
}

// PushBlob uploads in as blob desc through p (nothing when the registry has
// it already).
func PushBlob(ctx context.Context, p remotes.Pusher, desc ocispec.Descriptor, in io.Reader) error {
	w, err := p.Push(ctx, desc)
	if errdefs.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer w.Close()
	if _, err := io.CopyBuffer(w, in, make([]byte, 1<<20)); err != nil {
		return err
	}
	if err := w.Commit(ctx, desc.Size, desc.Digest); err != nil && !errdefs.IsAlreadyExists(err) {
		return err
	}
	return nil
}

// contentImage is an image in containerd's content store, read by
// go-containerregistry (partial.CompressedImageCore).
type contentImage struct {
	ctx              context.Context
	cs               content.Store
	manifest, config []byte
	layers           map[string]ocispec.Descriptor
}

func newContentImage(ctx context.Context, cs content.Store, mf ocispec.Manifest) (v1.Image, error) {
	cfg, err := content.ReadBlob(ctx, cs, mf.Config)
	if err != nil {
		return nil, fmt.Errorf("read the config: %w", err)
	}
	// The manifest is written anew in OCI form: only its layers and config
	// are read from it, its digest is never used.
	mf.MediaType = ocispec.MediaTypeImageManifest
	mf.Config.MediaType = ocispec.MediaTypeImageConfig
	raw, err := json.Marshal(mf)
	if err != nil {
		return nil, err
	}
	ci := &contentImage{ctx: ctx, cs: cs, manifest: raw, config: cfg, layers: map[string]ocispec.Descriptor{}}
	for _, l := range mf.Layers {
		ci.layers[l.Digest.String()] = l
	}
	return partial.CompressedToImage(ci)
}

func (i *contentImage) RawConfigFile() ([]byte, error) { return i.config, nil }
func (i *contentImage) MediaType() (types.MediaType, error) {
	return types.OCIManifestSchema1, nil
}
func (i *contentImage) RawManifest() ([]byte, error) { return i.manifest, nil }

func (i *contentImage) LayerByDigest(h v1.Hash) (partial.CompressedLayer, error) {
	d, ok := i.layers[h.String()]
	if !ok {
		return nil, fmt.Errorf("layer %s is not in the manifest", h)
	}
	return &contentLayer{img: i, desc: d}, nil
}

type contentLayer struct {
	img  *contentImage
	desc ocispec.Descriptor
}

func (l *contentLayer) Digest() (v1.Hash, error) { return v1.NewHash(l.desc.Digest.String()) }
func (l *contentLayer) Size() (int64, error)     { return l.desc.Size, nil }
func (l *contentLayer) MediaType() (types.MediaType, error) {
	return types.MediaType(l.desc.MediaType), nil
}

func (l *contentLayer) Compressed() (io.ReadCloser, error) {
	ra, err := l.img.cs.ReaderAt(l.img.ctx, l.desc)
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", l.desc.Digest, err)
	}
	return struct {
		io.Reader
		io.Closer
	}{io.NewSectionReader(ra, 0, ra.Size()), ra}, nil
}

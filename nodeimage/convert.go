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
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/sandman-dev/sandman/lazyimage"
)

// LabelLazyFrom is set on an image a lazy node started from its pool's
// conversion (Config.ConvertRepository): the conversion's reference.
const LabelLazyFrom = "sandman.io/lazy-from"

// AnnotationLazySource is the manifest annotation of a conversion in the
// pool's convert repository: the digest of the image it was made from (the
// manifest or index the node had pulled). A conversion is adopted for a
// pull of that digest only.
const AnnotationLazySource = "sandman.io/lazy-source"

// maxConversionManifest bounds the conversion manifest read before a pull.
const maxConversionManifest = 4 << 20

var (
	errAlreadyLazy = errors.New("some layers are eStargz already")
	// errNotShared: the image may not go to the pool's repository (a
	// tenant's, or not served anonymously as it was pulled).
	errNotShared = errors.New("not shared")
	// errNotFromSource: a conversion that does not say it was made from
	// the digest asked for.
	errNotFromSource = errors.New("not made from this image")
)

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

// pinned is name's repository at digest d (repo@d).
func pinned(name string, d digest.Digest) (string, error) {
	named, err := reference.ParseNormalizedNamed(name)
	if err != nil {
		return "", err
	}
	canonical, err := reference.WithDigest(reference.TrimNamed(named), d)
	if err != nil {
		return "", err
	}
	return canonical.String(), nil
}

// tenantImage says whether name lives where a tenant's images do (a
// snapshot repository, the snapshot registry, the checkpoint repository):
// their registry may serve them without credentials, but they are the
// tenant's, and a copy in the pool's repository would be anyone's.
func (m *Manager) tenantImage(name string) bool {
	_, _, snapshot := m.snapshots.Owner(name)
	_, _, tenant := m.tenants.Owner(name)
	return snapshot || tenant
}

// inConvertRepository says whether ref names an image in the pool's
// convert repository (by any name of its registry, as Owner matches).
func (m *Manager) inConvertRepository(ref string) bool {
	_, _, ok := m.convertRepo.Owner(ref)
	return ok
}

// checkPublic says whether name's registry serves digest d of it with no
// credentials: nil when it does. This, and not the tag's anonymous answer,
// proves the content public: a registry may name other content for the
// same tag to a pod's credentials.
func (m *Manager) checkPublic(ctx context.Context, name string, d digest.Digest) error {
	ref, err := pinned(name, d)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	defer context.AfterFunc(m.ctx, cancel)()
	if _, _, err := m.resolver(ctx, nil, nil).Resolve(ctx, ref); err != nil {
		return classify(ref, err)
	}
	return nil
}

// lazyPlan is what a pull of an image fetches on a node that converts.
type lazyPlan struct {
	// pull is what is pulled: the image's name, or its conversion pinned
	// to the digest of the manifest checked (repo@sha256:...).
	pull string
	// from is the conversion's name when pull is it (LabelLazyFrom).
	from string
	// convert: pulled whole, the image may be converted for the pool
	// (convertPulled decides once it knows what was pulled).
	convert bool
}

// lazySource says what a pull of name fetches on a node that converts
// (Config.ConvertRepository): name's conversion when the pool's registry
// has one made from the digest name resolves to; else name, and whether a
// conversion of it may be made once it is pulled. Never converted or
// adopted: a tenant's image (tenantImage), one in the convert repository
// itself, and a private one (its registry does not serve the digest
// anonymously): the pool's registry would serve it to anyone.
func (m *Manager) lazySource(ctx context.Context, name string, creds map[string][2]string) lazyPlan {
	whole := lazyPlan{pull: name}
	if !m.cfg.LazyPull || m.cfg.ConvertRepository == "" || m.inConvertRepository(name) || m.tenantImage(name) {
		return whole
	}
	var used atomic.Bool
	rctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	_, desc, err := m.resolver(rctx, creds, &used).Resolve(rctx, name)
	if err != nil {
		return whole // the pull says why
	}
	if used.Load() && m.checkPublic(rctx, name, desc.Digest) != nil {
		// The pod's credentials were asked for and the registry does not
		// serve this digest without them: private, pulled whole with them.
		// (Registries ask for credentials of public images too, Docker
		// Hub always.)
		return whole
	}
	ref, err := m.conversionRef(name, desc.Digest)
	if err != nil {
		m.cfg.Logger.Warn("lazy conversion: no name for it", "image", name, "err", err)
		return whole
	}
	pull, err := m.conversionOf(rctx, ref, desc.Digest)
	switch {
	case err == nil:
		return lazyPlan{pull: pull, from: ref}
	case errdefs.IsNotFound(err):
		return lazyPlan{pull: name, convert: true}
	case errors.Is(err, errNotFromSource):
		// Made from other content (or by an agent that did not record
		// it): a pull of this digest must not get it. Pulled whole, the
		// image is converted again and replaces it.
		m.cfg.Logger.Warn("lazy conversion: the pool's conversion was not made from this image; pulling it whole", "image", name, "digest", desc.Digest, "conversion", ref, "err", err)
		return lazyPlan{pull: name, convert: true}
	default:
		m.cfg.Logger.Warn("lazy conversion: the pool's registry does not answer; pulling the image whole", "image", name, "conversion", ref, "err", err)
		return whole
	}
}

// conversionOf reads the manifest of ref, a conversion in the pool's
// repository, and returns it pinned by digest (what the pull then fetches
// is what was checked) when it records source as what it was made from;
// errNotFromSource when it does not.
func (m *Manager) conversionOf(ctx context.Context, ref string, source digest.Digest) (string, error) {
	r := m.newResolver(ctx, m.convertCreds(), nil, nil)
	resolved, desc, err := r.Resolve(ctx, ref)
	if err != nil {
		return "", err
	}
	if !images.IsManifestType(desc.MediaType) {
		return "", fmt.Errorf("%s is a %s, not an image manifest: %w", ref, desc.MediaType, errNotFromSource)
	}
	f, err := r.Fetcher(ctx, resolved)
	if err != nil {
		return "", err
	}
	rc, err := f.Fetch(ctx, desc)
	if err != nil {
		return "", err
	}
	defer rc.Close()
	raw, err := io.ReadAll(io.LimitReader(rc, maxConversionManifest+1))
	if err != nil {
		return "", err
	}
	if len(raw) > maxConversionManifest || desc.Digest.Validate() != nil || desc.Digest.Algorithm().FromBytes(raw) != desc.Digest {
		return "", fmt.Errorf("the manifest of %s is not %s", ref, desc.Digest)
	}
	var mf ocispec.Manifest
	if err := json.Unmarshal(raw, &mf); err != nil {
		return "", fmt.Errorf("the manifest of %s: %w", ref, err)
	}
	if got := mf.Annotations[AnnotationLazySource]; got != source.String() {
		return "", fmt.Errorf("%s records source %q, want %s: %w", ref, got, source, errNotFromSource)
	}
	return pinned(ref, desc.Digest)
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

// adoptConversion records img, name's conversion ref (pulled pinned, as
// img.Name()), as name: binds of name use it, and the pool's name is not an
// image of the node.
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
	if err := is.Delete(ctx, img.Name()); err != nil && !errdefs.IsNotFound(err) {
		m.cfg.Logger.Warn("lazy conversion: drop the pool's name", "image", img.Name(), "err", err)
	}
	return ctrd.NewImage(m.cfg.Client, out), nil
}

// startConversion converts name (pulled whole as img; usedCreds: the
// registry was given credentials for it) into eStargz in the background and
// pushes it to the convert repository (convertPulled), so that the pool's
// next pulls of it are lazy. One conversion runs at a time on the node; one
// per image and digest.
func (m *Manager) startConversion(name string, img ctrd.Image, usedCreds bool) {
	key := name + "@" + img.Target().Digest.String()
	m.mu.Lock()
	if m.converting[key] {
		m.mu.Unlock()
		return
	}
	m.converting[key] = true
	m.mu.Unlock()
	started := m.goManaged(func() {
		defer func() {
			m.mu.Lock()
			delete(m.converting, key)
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
		ref, res, err := m.convertPulled(ctx, m.cfg.Client.ContentStore(), name, img, usedCreds)
		switch {
		case errors.Is(err, errAlreadyLazy):
			m.metrics.conversions.WithLabelValues("skipped").Inc()
		case errors.Is(err, errNotShared):
			m.metrics.conversions.WithLabelValues("private").Inc()
			m.cfg.Logger.Info("lazy conversion: not converted", "image", name, "digest", img.Target().Digest, "err", err)
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
		delete(m.converting, key)
		m.mu.Unlock()
	}
}

// convertPulled converts name as pulled into cs (img) and pushes it as
// the conversion of the digest pulled, img.Target(), whatever a resolve
// before the pull answered: a conversion is named after, and records
// (AnnotationLazySource), the content it was made from. It refuses
// (errNotShared) a tenant's image, and one pulled with credentials whose
// registry does not serve that digest anonymously.
func (m *Manager) convertPulled(ctx context.Context, cs content.Store, name string, img ctrd.Image, usedCreds bool) (ref string, _ lazyimage.Result, _ error) {
	d := img.Target().Digest
	if m.tenantImage(name) || m.inConvertRepository(name) {
		return "", lazyimage.Result{}, fmt.Errorf("a tenant's image or a conversion: %w", errNotShared)
	}
	if usedCreds {
		if err := m.checkPublic(ctx, name, d); err != nil {
			return "", lazyimage.Result{}, fmt.Errorf("%s is not served without credentials (%v): %w", d, err, errNotShared)
		}
	}
	ref, err := m.conversionRef(name, d)
	if err != nil {
		return "", lazyimage.Result{}, err
	}
	res, err := m.convert(ctx, cs, img, ref)
	return ref, res, err
}

// convert builds img's conversion from the node's content store cs (nothing
// is fetched again), its manifest annotated with img's digest
// (AnnotationLazySource), and pushes it as ref with the convert
// repository's credentials and the node's registry settings.
func (m *Manager) convert(ctx context.Context, cs content.Store, img ctrd.Image, ref string) (lazyimage.Result, error) {
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
	conv, ok := mutate.Annotations(c.Image, map[string]string{AnnotationLazySource: img.Target().Digest.String()}).(v1.Image)
	if !ok {
		return lazyimage.Result{}, errors.New("annotate the conversion: not an image")
	}
	pusher, err := m.newResolver(ctx, m.convertCreds(), nil, nil).Pusher(ctx, ref)
	if err != nil {
		return lazyimage.Result{}, err
	}
	layers, err := conv.Layers()
	if err != nil {
		return lazyimage.Result{}, err
	}
	om, err := conv.Manifest()
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
	cfg, err := conv.RawConfigFile()
	if err != nil {
		return lazyimage.Result{}, err
	}
	if err := PushBlob(ctx, pusher, ociDescriptor(om.Config), strings.NewReader(string(cfg))); err != nil {
		return lazyimage.Result{}, fmt.Errorf("push config: %w", err)
	}
	raw, err := conv.RawManifest()
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

package nodeimage

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/plugins/content/local"
	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/sandman-dev/sandman/lazyimage"
)

// newLazyManager is a Manager that converts, with no containerd: enough
// for what asks registries (lazySource, AuthorizePod, convertPulled).
func newLazyManager(t *testing.T, cfg Config) *Manager {
	t.Helper()
	cfg.LazyPull = true
	cfg.Logger = slog.New(slog.DiscardHandler)
	m := &Manager{cfg: cfg, metrics: newMetrics("test"), ctx: t.Context()}
	if err := m.parseRepositories(); err != nil {
		t.Fatal(err)
	}
	return m
}

func lazyDecision(t *testing.T, m *Manager, ref string, creds map[string][2]string) (pull string, convert bool) {
	p := m.lazySource(t.Context(), ref, creds)
	return p.pull, p.convert
}

// testRegistry is an in-memory registry served over HTTP; host is its
// host:port.
func testRegistry(t *testing.T, wrap func(http.Handler) http.Handler) (host string, backdoor string) {
	t.Helper()
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	plain := httptest.NewServer(h)
	t.Cleanup(plain.Close)
	backdoor = strings.TrimPrefix(plain.URL, "http://")
	if wrap == nil {
		return backdoor, backdoor
	}
	s := httptest.NewServer(wrap(h))
	t.Cleanup(s.Close)
	return strings.TrimPrefix(s.URL, "http://"), backdoor
}

// pushRandom pushes a new random image as ref (through host, the
// registry's address without auth) and returns it with its digest.
func pushRandom(t *testing.T, ref string, annotations map[string]string) (v1.Image, digest.Digest) {
	t.Helper()
	img, err := random.Image(64, 1)
	if err != nil {
		t.Fatal(err)
	}
	if annotations != nil {
		img = mutate.Annotations(img, annotations).(v1.Image)
	}
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, remote.WithContext(t.Context())); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return img, digest.Digest(d.String())
}

// splitView is Docker's token auth in front of a registry whose tag
// /v2/<repo>/manifests/<tag> names anon for anonymous tokens and authed
// for a token got with user:pass; anonymous tokens do not see authed at
// all (the registry serves it only with credentials).
type splitView struct {
	repo, tag    string
	anon, authed digest.Digest
}

func (v *splitView) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/token" {
			user, pass, ok := r.BasicAuth()
			if !ok {
				_ = r.ParseForm()
				user, pass = r.PostForm.Get("username"), r.PostForm.Get("password")
			}
			tok := "anon"
			if user == "user" && pass == "pass" {
				tok = "authed"
			}
			_ = json.NewEncoder(w).Encode(map[string]string{"token": tok, "access_token": tok})
			return
		}
		tok := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		if tok != "anon" && tok != "authed" {
			w.Header().Set("WWW-Authenticate", `Bearer realm="http://`+r.Host+`/token",service="test",scope="repository:`+v.repo+`:pull"`)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		manifests := "/v2/" + v.repo + "/manifests/"
		switch {
		case r.URL.Path == manifests+v.tag && tok == "anon":
			r.URL.Path = manifests + v.anon.String()
		case r.URL.Path == manifests+v.tag:
			r.URL.Path = manifests + v.authed.String()
		case r.URL.Path == manifests+v.authed.String() && tok == "anon":
			http.Error(w, `{"errors":[{"code":"MANIFEST_UNKNOWN"}]}`, http.StatusNotFound)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// TestLazySourceTenantImages: a node that converts never converts (nor
// adopts a conversion of) an image of a tenant: one under a snapshot
// repository, by any name of its registry, or one its registry serves
// anonymously under the tag but not as the digest the pod's credentials
// get. An ordinary public image is converted.
func TestLazySourceTenantImages(t *testing.T) {
	pool, _ := testRegistry(t, nil)
	src, _ := testRegistry(t, nil)
	_, port, _ := strings.Cut(src, ":")
	convertRepo := pool + "/pool"

	_, pubD := pushRandom(t, src+"/lib/app:v1", nil)
	_, snapD := pushRandom(t, src+"/sandman/e2b/team-b/prep:v1", nil)

	// The split registry: tag v1 is public content anonymously, private
	// content with the pod's credentials.
	var split splitView
	split.repo, split.tag = "team/task", "v1"
	flip, flipBack := testRegistry(t, func(h http.Handler) http.Handler { return split.wrap(h) })
	_, split.anon = pushRandom(t, flipBack+"/team/task:public", nil)
	_, split.authed = pushRandom(t, flipBack+"/team/task:private", nil)
	flipCreds := map[string][2]string{flip: {"user", "pass"}}

	for i, tc := range []struct {
		name      string
		ref       string
		snapshots []string
		tenants   []string
		creds     map[string][2]string
		// conversion: a conversion of ref's digest is in the pool,
		// correctly made.
		conversion  digest.Digest
		wantConvert bool
		wantAdopt   bool
	}{
		{name: "public image", ref: src + "/lib/app:v1", wantConvert: true},
		{name: "public image, converted", ref: src + "/lib/app:v1", conversion: pubD, wantAdopt: true},
		{name: "snapshot", ref: src + "/sandman/e2b/team-b/prep:v1", snapshots: []string{src + "/sandman/e2b"}},
		{name: "snapshot, converted by an old agent", ref: src + "/sandman/e2b/team-b/prep:v1", snapshots: []string{src + "/sandman/e2b"}, conversion: snapD},
		{name: "snapshot under another name of its registry", ref: src + "/sandman/e2b/team-b/prep:v1", snapshots: []string{"localhost:" + port + "/sandman/e2b"}},
		{name: "snapshot repository without a prefix", ref: src + "/sandman/e2b/team-b/prep:v1", snapshots: []string{src}},
		{name: "snapshot registry", ref: src + "/sandman/e2b/team-b/prep:v1", tenants: []string{src + "/sandman"}},
		{name: "snapshot registry, converted by an old agent", ref: src + "/sandman/e2b/team-b/prep:v1", tenants: []string{src + "/sandman"}, conversion: snapD},
		{name: "beside the snapshot registry", ref: src + "/lib/app:v1", tenants: []string{src + "/sandman"}, wantConvert: true},
		{name: "private under the pod's credentials, public tag anonymously", ref: flip + "/team/task:v1", creds: flipCreds},
		{name: "private: no anonymous answer", ref: flip + "/team/task@" + split.authed.String(), creds: flipCreds},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A repository of its own per case: no case sees another's
			// conversions.
			m := newLazyManager(t, Config{ConvertRepository: fmt.Sprintf("%s/%d", convertRepo, i), SnapshotRepositories: tc.snapshots, TenantRepositories: tc.tenants})
			if tc.conversion != "" {
				conv, err := m.conversionRef(tc.ref, tc.conversion)
				if err != nil {
					t.Fatal(err)
				}
				pushRandom(t, conv, map[string]string{AnnotationLazySource: tc.conversion.String()})
			}
			pull, convert := lazyDecision(t, m, tc.ref, tc.creds)
			if adopted := pull != tc.ref; adopted != tc.wantAdopt {
				t.Errorf("pull %s: adopted %v, want %v", pull, adopted, tc.wantAdopt)
			}
			if tc.wantAdopt && !strings.Contains(pull, "@"+digest.Canonical.String()+":") {
				t.Errorf("pull %s: a conversion is pulled pinned to the manifest checked", pull)
			}
			if convert != tc.wantConvert {
				t.Errorf("convert %v, want %v", convert, tc.wantConvert)
			}
		})
	}
}

// TestAuthorizePodConversionName: a pod cannot start an image by its name
// in the pool's convert repository (by any name of that registry); it
// names the source, whose checks then apply.
func TestAuthorizePodConversionName(t *testing.T) {
	d := digest.FromString("m")
	tag := ":sha256-" + d.Encoded() + "-esgz"
	m := newLazyManager(t, Config{ConvertRepository: "127.0.0.1:5000/pool", SnapshotRepositories: []string{"reg.example:5000/sandman/e2b"}})
	for _, tc := range []struct {
		ref     string
		refused bool
	}{
		{"127.0.0.1:5000/pool/reg.example-5000/sandman/e2b/team-b/prep" + tag, true},
		{"localhost:5000/pool/docker.io/library/python" + tag, true},
		{"127.0.0.1:5000/pool/docker.io/library/python@" + d.String(), true},
		{"reg.example:5000/sandman/e2b/team-b/prep:v1", true},
		{"reg.example:5000/sandman/e2b/team-a/prep:v1", false},
		{"docker.io/library/python:3.12", false},
		{"127.0.0.1:5000/poolx/python:3.12", false},
	} {
		t.Run(tc.ref, func(t *testing.T) {
			err := m.AuthorizePod(t.Context(), tc.ref, "team-a", nil)
			if refused := err != nil; refused != tc.refused {
				t.Fatalf("AuthorizePod: %v, refused %v", err, tc.refused)
			}
			if tc.refused && (KindOf(err) != KindForbidden || !errdefs.IsPermissionDenied(err)) {
				t.Errorf("refused with %v (kind %q), want Forbidden", err, KindOf(err))
			}
		})
	}
}

// TestLazySourceConversionDigest: a pull pinned to D1 adopts only a
// conversion made from D1: one pushed under D1's name but made from other
// content (a registry that answered D1, then served D2), or from an agent
// that did not record its source, is not adopted; the image is pulled
// whole and converted again.
func TestLazySourceConversionDigest(t *testing.T) {
	pool, _ := testRegistry(t, nil)
	src, _ := testRegistry(t, nil)
	_, d1 := pushRandom(t, src+"/app:v1", nil)
	_, d2 := pushRandom(t, src+"/app:v2", nil)
	for i, tc := range []struct {
		name        string
		annotations map[string]string
		adopt       bool
	}{
		{"made from D1", map[string]string{AnnotationLazySource: d1.String()}, true},
		{"made from D2", map[string]string{AnnotationLazySource: d2.String()}, false},
		{"source not recorded", nil, false},
		{"source not a digest", map[string]string{AnnotationLazySource: "v1"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newLazyManager(t, Config{ConvertRepository: fmt.Sprintf("%s/pool/%d", pool, i)})
			ref := src + "/app@" + d1.String()
			conv, err := m.conversionRef(ref, d1)
			if err != nil {
				t.Fatal(err)
			}
			pushRandom(t, conv, tc.annotations)
			pull, convert := lazyDecision(t, m, ref, nil)
			if adopted := pull != ref; adopted != tc.adopt {
				t.Errorf("pull %s: adopted %v, want %v", pull, adopted, tc.adopt)
			}
			if convert == tc.adopt {
				t.Errorf("convert %v, want %v", convert, !tc.adopt)
			}
		})
	}
}

// pulledImage is an image as a pull left it: its target in a content store.
type pulledImage struct {
	ctrd.Image
	target ocispec.Descriptor
}

func (i pulledImage) Target() ocispec.Descriptor { return i.target }

// storeImage writes img into cs as a pull would and returns it.
func storeImage(t *testing.T, cs content.Store, img v1.Image) ctrd.Image {
	t.Helper()
	ctx := t.Context()
	write := func(desc ocispec.Descriptor, b []byte) {
		if err := content.WriteBlob(ctx, cs, desc.Digest.String(), bytes.NewReader(b), desc); err != nil {
			t.Fatal(err)
		}
	}
	mf, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	write(ociDescriptor(mf.Config), cfg)
	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range layers {
		rc, err := l.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		write(ociDescriptor(mf.Layers[i]), b)
	}
	raw, err := img.RawManifest()
	if err != nil {
		t.Fatal(err)
	}
	mt, err := img.MediaType()
	if err != nil {
		t.Fatal(err)
	}
	desc := ocispec.Descriptor{MediaType: string(mt), Digest: digest.FromBytes(raw), Size: int64(len(raw))}
	write(desc, raw)
	return pulledImage{target: desc}
}

// TestConvertPulled: a conversion is named after, and records, the digest
// the node pulled, not what a resolve before the pull answered (a
// registry that answers D1 then serves D2); content pulled with
// credentials is converted only when its registry serves that digest
// anonymously, and a tenant's image never.
func TestConvertPulled(t *testing.T) {
	pool, _ := testRegistry(t, nil)
	src, _ := testRegistry(t, nil)
	_, d1 := pushRandom(t, src+"/lib/app:v1", nil)
	served, _ := pushRandom(t, src+"/lib/app:v2", nil)

	var split splitView
	split.repo, split.tag = "team/task", "v1"
	flip, flipBack := testRegistry(t, split.wrap)
	public, anon := pushRandom(t, flipBack+"/team/task:public", nil)
	private, authed := pushRandom(t, flipBack+"/team/task:private", nil)
	split.anon, split.authed = anon, authed

	for i, tc := range []struct {
		name      string
		ref       string
		pulled    v1.Image
		usedCreds bool
		tenants   []string
		// notNamed: a conversion name that must not be pushed.
		notNamed digest.Digest
		shared   bool
	}{
		{name: "resolved D1, pulled D2", ref: src + "/lib/app:v1", pulled: served, notNamed: d1, shared: true},
		{name: "with credentials, public digest", ref: flip + "/team/task:v1", pulled: public, usedCreds: true, shared: true},
		{name: "with credentials, private digest", ref: flip + "/team/task:v1", pulled: private, usedCreds: true, notNamed: authed},
		{name: "tenant's", ref: src + "/lib/app:v1", pulled: served, tenants: []string{src + "/lib"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newLazyManager(t, Config{ConvertRepository: fmt.Sprintf("%s/pool/%d", pool, i), ConvertDir: t.TempDir(), TenantRepositories: tc.tenants})
			cs, err := local.NewStore(t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			img := storeImage(t, cs, tc.pulled)
			pulledD := img.Target().Digest
			ref, _, err := m.convertPulled(t.Context(), cs, tc.ref, img, tc.usedCreds)
			if !tc.shared {
				if !errors.Is(err, errNotShared) {
					t.Fatalf("convertPulled: %s, %v; want it not shared", ref, err)
				}
			} else if err != nil {
				t.Fatal(err)
			}
			want, err := m.conversionRef(tc.ref, pulledD)
			if err != nil {
				t.Fatal(err)
			}
			if tc.shared && ref != want {
				t.Errorf("pushed as %s, want %s (the digest pulled)", ref, want)
			}
			got, err := remote.Image(mustRef(t, want), remote.WithContext(t.Context()))
			if !tc.shared {
				if err == nil {
					t.Errorf("%s was pushed", want)
				}
				return
			}
			if err != nil {
				t.Fatalf("the conversion %s: %v", want, err)
			}
			mf, err := got.Manifest()
			if err != nil {
				t.Fatal(err)
			}
			if mf.Annotations[AnnotationLazySource] != pulledD.String() || !lazyimage.IsLazy(mf) {
				t.Errorf("the conversion records source %q (want %s), eStargz %v", mf.Annotations[AnnotationLazySource], pulledD, lazyimage.IsLazy(mf))
			}
			if tc.notNamed != "" {
				other, err := m.conversionRef(tc.ref, tc.notNamed)
				if err != nil {
					t.Fatal(err)
				}
				if _, err := remote.Head(mustRef(t, other), remote.WithContext(t.Context())); err == nil {
					t.Errorf("a conversion was pushed as %s", other)
				}
			}
		})
	}
}

func mustRef(t *testing.T, ref string) name.Reference {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

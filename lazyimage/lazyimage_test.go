package lazyimage

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"log"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/containerd/stargz-snapshotter/estargz"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/opencontainers/go-digest"
)

type entry struct {
	name, link string
	mode       int64
	typ        byte
	data       []byte
}

func layer(t *testing.T, entries ...entry) v1.Layer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Mode: e.mode, Typeflag: e.typ, Size: int64(len(e.data))}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(e.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func random(t *testing.T, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// pushImage writes a two-layer image (a file overwritten by the second
// layer, a symlink, a 1 MiB incompressible file) with a config to keep.
func pushImage(t *testing.T, ref name.Reference) v1.Image {
	t.Helper()
	l1 := layer(t,
		entry{name: "bin/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "bin/tool", typ: tar.TypeReg, mode: 0o755, data: []byte("#!/bin/sh\necho old\n")},
		entry{name: "data/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "data/big", typ: tar.TypeReg, mode: 0o600, data: random(t, 1<<20)},
	)
	l2 := layer(t,
		entry{name: "bin/tool", typ: tar.TypeReg, mode: 0o755, data: []byte("#!/bin/sh\necho new\n")},
		entry{name: "app/", typ: tar.TypeDir, mode: 0o755},
		entry{name: "app/main.sh", typ: tar.TypeReg, mode: 0o644, data: []byte("tool\n")},
		entry{name: "app/link", typ: tar.TypeSymlink, link: "main.sh", mode: 0o777},
	)
	img, err := mutate.AppendLayers(mutate.MediaType(empty.Image, types.OCIManifestSchema1), l1, l2)
	if err != nil {
		t.Fatal(err)
	}
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Config.Env = []string{"PATH=/bin", "A=1"}
	cf.Config.Cmd = []string{"/bin/tool"}
	cf.Config.WorkingDir = "/app"
	cf.Config.User = "1000"
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	return img
}

// files is the image's filesystem as a full pull leaves it.
func files(t *testing.T, img v1.Image) map[string]string {
	t.Helper()
	out := map[string]string{}
	tr := tar.NewReader(mutate.Extract(img))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[strings.TrimSuffix(h.Name, "/")] = string(rune(h.Typeflag)) + " " + h.FileInfo().Mode().String() + " " + h.Linkname + " " + digest.FromBytes(b).String()
	}
}

func TestConvert(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	src, err := name.ParseReference(host+"/task/repo:v1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	orig := pushImage(t, src)
	dst, err := DefaultTarget(src)
	if err != nil {
		t.Fatal(err)
	}
	if want := host + "/task/repo:v1-esgz"; dst.Name() != want {
		t.Fatalf("default target %s, want %s", dst.Name(), want)
	}

	var last Progress
	calls := 0
	res, err := Convert(context.Background(), src, dst, Options{
		Prioritized: []string{"app/main.sh", "bin/tool"},
		Progress:    func(p Progress) { last = p; calls++ },
		TempDir:     t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Layers != 2 || res.Converted != 2 || res.Already {
		t.Fatalf("result %+v, want 2 layers converted", res)
	}
	if calls != 3 || last.Layer != 2 || last.Done != last.Total || last.Total == 0 {
		t.Fatalf("progress: %d calls, last %+v", calls, last)
	}

	got, err := remote.Image(res.Target)
	if err != nil {
		t.Fatal(err)
	}
	m, err := got.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if !IsLazy(m) {
		t.Fatalf("converted manifest has a layer without %s: %+v", TOCDigestAnnotation, m.Layers)
	}
	// Each layer's TOC is what its annotation says (the snapshotter checks
	// exactly this), and the prioritized files come first.
	ls, err := got.Layers()
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range ls {
		rc, err := l.Compressed()
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		r, err := estargz.Open(io.NewSectionReader(bytes.NewReader(b), 0, int64(len(b))))
		if err != nil {
			t.Fatalf("layer %d is not eStargz: %v", i, err)
		}
		toc, err := digest.Parse(m.Layers[i].Annotations[TOCDigestAnnotation])
		if err != nil {
			t.Fatal(err)
		}
		if _, err := r.VerifyTOC(toc); err != nil {
			t.Fatalf("layer %d: TOC does not match its annotation: %v", i, err)
		}
		if i == 1 {
			if _, ok := r.Lookup(".prefetch.landmark"); !ok {
				t.Errorf("layer 1 holds prioritized files but no prefetch landmark")
			}
		}
	}
	// A full pull of the conversion gives the same files, but for eStargz's
	// own two (its TOC and the landmark), which the snapshotter hides.
	want, have := files(t, orig), files(t, got)
	for _, extra := range []string{estargz.TOCTarName, ".prefetch.landmark", ".no.prefetch.landmark"} {
		delete(have, extra)
	}
	if len(want) != len(have) {
		t.Errorf("converted image has %d entries, the original %d:\n%v\n%v", len(have), len(want), have, want)
	}
	for n, w := range want {
		if have[n] != w {
			t.Errorf("%s: converted %q, original %q", n, have[n], w)
		}
	}
	// The config runs the image as before.
	ocf, _ := orig.ConfigFile()
	ncf, err := got.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if ncf.Config.User != ocf.Config.User || ncf.Config.WorkingDir != ocf.Config.WorkingDir ||
		strings.Join(ncf.Config.Env, ",") != strings.Join(ocf.Config.Env, ",") || strings.Join(ncf.Config.Cmd, ",") != strings.Join(ocf.Config.Cmd, ",") ||
		ncf.OS != "linux" || ncf.Architecture != "amd64" || len(ncf.RootFS.DiffIDs) != 2 {
		t.Errorf("config changed: %+v", ncf)
	}

	// Converting the conversion in place writes nothing.
	again, err := Convert(context.Background(), res.Target, res.Target, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !again.Already || again.Converted != 0 || again.Target != res.Target {
		t.Errorf("second conversion %+v, want Already with the same digest", again)
	}
}

func TestConvertMissing(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	src, err := name.ParseReference(strings.TrimPrefix(srv.URL, "http://")+"/no/such:v1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	dst, _ := DefaultTarget(src)
	_, err = Convert(context.Background(), src, dst, Options{})
	if err == nil || !strings.Contains(err.Error(), "read "+src.Name()) || !strings.Contains(err.Error(), "NAME_UNKNOWN") {
		t.Fatalf("Convert of a missing image: %v, want an error naming it and the registry's answer", err)
	}
}

package main

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// fixture writes small stand-ins for binaries and returns the files of two
// images: one shaped like sandman-vk, one like sandman-node.
func fixture(t *testing.T) (dir string, vk, node []File) {
	t.Helper()
	dir = t.TempDir()
	for n, content := range map[string]string{"vk": "#!vk\n", "node": "#!node\n", "daemon": "#!daemon\n"} {
		if err := os.WriteFile(filepath.Join(dir, n), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	vk = []File{{Path: "/usr/local/bin/sandman-vk", Source: filepath.Join(dir, "vk"), Mode: 0o755}}
	node = []File{
		{Path: "/usr/local/lib/sandman/sandman-daemon", Source: filepath.Join(dir, "daemon"), Mode: 0o755},
		{Path: "/usr/local/bin/sandman-node", Source: filepath.Join(dir, "node"), Mode: 0o755},
	}
	return dir, vk, node
}

var (
	vkConfig   = Config{Entrypoint: []string{"/usr/local/bin/sandman-vk"}, User: nonroot}
	nodeConfig = Config{Entrypoint: []string{"/usr/local/bin/sandman-node"}, User: "0:0"}
)

func build(t *testing.T, files []File, cfg Config) (v1.Image, v1.Hash) {
	t.Helper()
	img, err := Build(files, cfg)
	if err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return img, d
}

func TestBuildReproducible(t *testing.T) {
	dir, vk, node := fixture(t)
	_, vk1 := build(t, vk, vkConfig)
	_, node1 := build(t, node, nodeConfig)
	// New mtimes on the sources, and a second build: the same digests.
	future := time.Now().Add(time.Hour)
	for _, f := range append(slices.Clone(vk), node...) {
		if err := os.Chtimes(f.Source, future, future); err != nil {
			t.Fatal(err)
		}
	}
	if _, got := build(t, vk, vkConfig); got != vk1 {
		t.Errorf("vk digest changed between builds: %s, then %s", vk1, got)
	}
	if _, got := build(t, node, nodeConfig); got != node1 {
		t.Errorf("node digest changed between builds: %s, then %s", node1, got)
	}
	if vk1 == node1 {
		t.Errorf("vk and node images have the same digest %s", vk1)
	}

	tests := []struct {
		name   string
		change func(files []File, cfg *Config)
	}{
		{"file content", func([]File, *Config) {
			if err := os.WriteFile(filepath.Join(dir, "daemon"), []byte("#!daemon v2\n"), 0o600); err != nil {
				t.Fatal(err)
			}
		}},
		{"file mode", func(f []File, _ *Config) { f[0].Mode = 0o700 }},
		{"file path", func(f []File, _ *Config) { f[0].Path = "/usr/local/bin/sandman-daemon" }},
		{"user", func(_ []File, c *Config) { c.User = nonroot }},
		{"created", func(_ []File, c *Config) { c.Created = time.Unix(1700000000, 0) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files, cfg := slices.Clone(node), nodeConfig
			tt.change(files, &cfg)
			if _, got := build(t, files, cfg); got == node1 {
				t.Errorf("digest %s did not change", got)
			}
		})
	}
}

func TestBuildContents(t *testing.T) {
	_, _, node := fixture(t)
	img, _ := build(t, node, nodeConfig)
	m, err := img.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if m.MediaType != types.OCIManifestSchema1 || m.Config.MediaType != types.OCIConfigJSON {
		t.Errorf("media types: manifest %s, config %s; want OCI", m.MediaType, m.Config.MediaType)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "amd64" || !cf.Created.Equal(time.Unix(0, 0)) || len(cf.History) != 0 {
		t.Errorf("config: os %s arch %s created %s, %d history entries; want linux amd64, the epoch, none",
			cf.OS, cf.Architecture, cf.Created, len(cf.History))
	}
	if cf.Config.User != "0:0" || !slices.Equal(cf.Config.Entrypoint, []string{"/usr/local/bin/sandman-node"}) {
		t.Errorf("config: user %q, entrypoint %q", cf.Config.User, cf.Config.Entrypoint)
	}

	layers, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"etc/ dir 755", "etc/group file 644", "etc/passwd file 644", "tmp/ dir 1777"},
		{"usr/ dir 755", "usr/local/ dir 755", "usr/local/bin/ dir 755", "usr/local/bin/sandman-node file 755",
			"usr/local/lib/ dir 755", "usr/local/lib/sandman/ dir 755", "usr/local/lib/sandman/sandman-daemon file 755"},
	}
	if len(layers) != len(want) {
		t.Fatalf("%d layers, want base and binaries", len(layers))
	}
	for i, l := range layers {
		if mt, _ := l.MediaType(); mt != types.OCILayer {
			t.Errorf("layer %d: media type %s, want %s", i, mt, types.OCILayer)
		}
		if got := entries(t, l); !slices.Equal(got, want[i]) {
			t.Errorf("layer %d entries:\n got %q\nwant %q", i, got, want[i])
		}
	}
}

// entries lists a layer as "path type mode", checking the header fields that
// must not vary between builds.
func entries(t *testing.T, l v1.Layer) []string {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	var out []string
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.ModTime.Unix() != 0 || h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: mtime %s, owner %d:%d (%q:%q); want 0, 0:0 without names", h.Name, h.ModTime, h.Uid, h.Gid, h.Uname, h.Gname)
		}
		kind := "file"
		if h.Typeflag == tar.TypeDir {
			kind = "dir"
		}
		out = append(out, fmt.Sprintf("%s %s %o", h.Name, kind, h.Mode))
	}
}

// TestPushAndLayout pushes to an in-memory registry, twice, and writes an
// OCI layout: every tag and the layout hold the digest Build computed.
func TestPushAndLayout(t *testing.T) {
	_, vk, _ := fixture(t)
	img, d := build(t, vk, vkConfig)
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	repo := strings.TrimPrefix(srv.URL, "http://") + "/sandman/sandman-vk"
	ropts := []name.Option{name.Insecure}
	quiet := slog.New(slog.DiscardHandler)
	for range 2 {
		if err := push(t.Context(), quiet, img, d, repo, []string{"dev", "abc1234"}, ropts); err != nil {
			t.Fatal(err)
		}
	}
	for _, tag := range []string{"dev", "abc1234"} {
		ref, err := name.NewTag(repo+":"+tag, ropts...)
		if err != nil {
			t.Fatal(err)
		}
		desc, err := remote.Head(ref, remote.WithContext(t.Context()))
		if err != nil {
			t.Fatal(err)
		}
		if desc.Digest != d {
			t.Errorf("%s: registry has %s, built %s", ref, desc.Digest, d)
		}
	}

	lp, err := layout.Write(t.TempDir(), mutate.AppendManifests(empty.Index, layoutEntry(img, "sandman/sandman-vk:dev")))
	if err != nil {
		t.Fatal(err)
	}
	ii, err := lp.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	im, err := ii.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Digest != d {
		t.Errorf("layout index %+v, want one manifest %s", im.Manifests, d)
	}
	if _, err := lp.Image(d); err != nil {
		t.Errorf("layout image %s: %v", d, err)
	}
}

func TestListFlag(t *testing.T) {
	var l listFlag
	for _, v := range []string{"dev", "abc1234, latest", ""} {
		if err := l.Set(v); err != nil {
			t.Fatal(err)
		}
	}
	if want := []string{"dev", "abc1234", "latest"}; !slices.Equal(l, want) {
		t.Errorf("tags %q, want %q", l, want)
	}
	if _, err := selectSpecs([]string{"sandman-vk", "nope"}); err == nil {
		t.Error("selectSpecs accepted an unknown image")
	}
	if s, err := selectSpecs(nil); err != nil || len(s) != len(specs) {
		t.Errorf("selectSpecs(nil) = %d specs, %v; want all", len(s), err)
	}
}

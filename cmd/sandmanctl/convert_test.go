package main

import (
	"io"
	"log"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/sandman-dev/sandman/lazyimage"
)

// TestImagesConvert: `sandmanctl images convert` needs no cluster, pushes the
// eStargz conversion beside its source, prints it with its digest, and exits
// 3 for an image the registry does not have.
func TestImagesConvert(t *testing.T) {
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	t.Setenv("DOCKER_CONFIG", t.TempDir())
	img, err := random.Image(4096, 3)
	if err != nil {
		t.Fatal(err)
	}
	src, err := name.ParseReference(host + "/task/swe:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(src, img); err != nil {
		t.Fatal(err)
	}
	none := filepath.Join(t.TempDir(), "none")

	var out, errw strings.Builder
	if code := run(t.Context(), []string{"--kubeconfig", none, "images", "convert", "--prioritize", "/etc/passwd", host + "/task/swe:v1"}, &out, &errw); code != 0 {
		t.Fatalf("exit %d: %s", code, errw.String())
	}
	printed := strings.TrimSpace(out.String())
	if !strings.HasPrefix(printed, host+"/task/swe:v1-esgz@sha256:") {
		t.Fatalf("printed %q, want the target with its digest", printed)
	}
	if !strings.Contains(errw.String(), "converted "+host+"/task/swe:v1: 3 layers") {
		t.Errorf("summary: %q", errw.String())
	}
	dst, err := name.ParseReference(printed)
	if err != nil {
		t.Fatal(err)
	}
	got, err := remote.Image(dst)
	if err != nil {
		t.Fatal(err)
	}
	m, err := got.Manifest()
	if err != nil {
		t.Fatal(err)
	}
	if !lazyimage.IsLazy(m) || len(m.Layers) != 3 {
		t.Fatalf("pushed manifest is not eStargz: %+v", m.Layers)
	}

	out.Reset()
	errw.Reset()
	if code := run(t.Context(), []string{"--kubeconfig", none, "images", "convert", host + "/task/none:v1"}, &out, &errw); code != exitNotFound {
		t.Errorf("missing image: exit %d (%s), want %d", code, errw.String(), exitNotFound)
	}
	if !strings.Contains(errw.String(), host+"/task/none:v1") {
		t.Errorf("missing image: %q does not name it", errw.String())
	}
	if code := run(t.Context(), []string{"--kubeconfig", none, "images", "convert", "--to", host + "/x:y", host + "/a:1", host + "/b:1"}, &out, &errw); code != exitUsage {
		t.Errorf("--to with two images: exit %d, want %d", code, exitUsage)
	}
	if code := run(t.Context(), []string{"--kubeconfig", none, "images", "convert"}, &out, &errw); code != exitUsage {
		t.Errorf("no image: exit %d, want %d", code, exitUsage)
	}
}

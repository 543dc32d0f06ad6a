package daemon_test

import (
	"archive/tar"
	"bytes"
	"crypto/rand"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
)

func TestFilesRoundTrip(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	dir := t.TempDir()
	p := filepath.Join(dir, "a/b/c.bin")
	data := make([]byte, 3<<20)
	_, _ = rand.Read(data)
	res, err := h.client.WriteFile(ctx, p, bytes.NewReader(data), 0o600)
	if err != nil {
		t.Fatal(err)
	}
	if res.Bytes != int64(len(data)) {
		t.Fatalf("wrote %d bytes, want %d", res.Bytes, len(data))
	}
	fi, err := os.Stat(p)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("stat %v mode %v", err, fi.Mode())
	}
	rc, err := h.client.ReadFile(ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(rc)
	rc.Close()
	if !bytes.Equal(got, data) {
		t.Fatal("read back different bytes")
	}
	// Overwrite is atomic: no temporary files stay behind.
	if _, err := h.client.WriteFile(ctx, p, strings.NewReader("new"), 0); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(filepath.Dir(p))
	if len(entries) != 1 {
		t.Fatalf("directory holds %d entries after overwrite, want 1", len(entries))
	}
	st, err := h.client.Stat(ctx, p)
	if err != nil || st.Type != "file" || st.Size != 3 || st.Mode != "0644" {
		t.Fatalf("stat %+v %v", st, err)
	}
}

func TestFilesErrors(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "file"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "full/sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	check := func(name string, err error, code string) {
		t.Helper()
		if !client.IsCode(err, code) {
			t.Errorf("%s: err = %v, want %s", name, err, code)
		}
	}
	_, err := h.client.ReadFile(ctx, "relative/path")
	check("relative path", err, api.CodeBadRequest)
	_, err = h.client.ReadFile(ctx, "")
	check("missing path", err, api.CodeBadRequest)
	_, err = h.client.ReadFile(ctx, filepath.Join(dir, "nope"))
	check("not found", err, api.CodeNotFound)
	_, err = h.client.ReadFile(ctx, dir)
	check("read a directory", err, api.CodeIsADirectory)
	_, err = h.client.List(ctx, filepath.Join(dir, "file"), 1)
	check("list a file", err, api.CodeNotADirectory)
	_, err = h.client.WriteFile(ctx, filepath.Join(dir, "file/under"), strings.NewReader("x"), 0)
	check("write under a file", err, api.CodeNotADirectory)
	_, err = h.client.WriteFile(ctx, filepath.Join(dir, "full"), strings.NewReader("x"), 0)
	check("write over a directory", err, api.CodeIsADirectory)
	err = h.client.Remove(ctx, filepath.Join(dir, "full"), false)
	check("remove a non-empty directory", err, api.CodeConflict)
	err = h.client.Remove(ctx, filepath.Join(dir, "nope"), false)
	check("remove a missing path", err, api.CodeNotFound)
	_, err = h.client.Move(ctx, filepath.Join(dir, "file"), filepath.Join(dir, "full"), false)
	check("move onto an existing path", err, api.CodeConflict)

	if err := os.Chmod(filepath.Join(dir, "file"), 0); err == nil && os.Geteuid() != 0 {
		_, err = h.client.ReadFile(ctx, filepath.Join(dir, "file"))
		check("permission", err, api.CodeForbidden)
	}
	if _, err := h.client.Health(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestFilesListStatMoveRemove(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	dir := t.TempDir()
	for _, p := range []string{"a/1", "a/b/2", "a/b/c/3", "top"} {
		if _, err := h.client.WriteFile(ctx, filepath.Join(dir, p), strings.NewReader(p), 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("top", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	names := func(depth int) []string {
		l, err := h.client.List(ctx, dir, depth)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, e := range l.Entries {
			rel, _ := filepath.Rel(dir, e.Path)
			out = append(out, rel)
		}
		return out
	}
	if got := strings.Join(names(1), ","); got != "a,link,top" {
		t.Fatalf("depth 1: %s", got)
	}
	if got := strings.Join(names(2), ","); got != "a,a/1,a/b,link,top" {
		t.Fatalf("depth 2: %s", got)
	}
	if got := len(names(10)); got != 8 {
		t.Fatalf("depth 10: %d entries, want 8", got)
	}
	st, err := h.client.Stat(ctx, filepath.Join(dir, "link"))
	if err != nil || st.Type != "symlink" || st.Target != "top" {
		t.Fatalf("stat link %+v %v", st, err)
	}
	if _, err := h.client.Move(ctx, filepath.Join(dir, "top"), filepath.Join(dir, "new/place"), false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "new/place")); err != nil {
		t.Fatal(err)
	}
	if err := h.client.Remove(ctx, filepath.Join(dir, "a"), true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "a")); !os.IsNotExist(err) {
		t.Fatalf("a still there: %v", err)
	}
	if _, err := h.client.Mkdir(ctx, filepath.Join(dir, "m/n"), 0o700); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, "m/n")); err != nil || !fi.IsDir() {
		t.Fatalf("mkdir: %v", err)
	}
}

func TestFilesTar(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	src := t.TempDir()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(hdr *tar.Header, body string) {
		hdr.Size = int64(len(body))
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write([]byte(body))
	}
	add(&tar.Header{Name: "dir/", Typeflag: tar.TypeDir, Mode: 0o755}, "")
	add(&tar.Header{Name: "dir/x.py", Typeflag: tar.TypeReg, Mode: 0o755}, "print(1)\n")
	add(&tar.Header{Name: "top.txt", Typeflag: tar.TypeReg, Mode: 0o644}, "top")
	add(&tar.Header{Name: "ln", Typeflag: tar.TypeSymlink, Linkname: "top.txt"}, "")
	tw.Close()
	res, err := h.client.UploadTar(ctx, filepath.Join(src, "up"), &buf)
	if err != nil {
		t.Fatal(err)
	}
	if res.Entries != 4 {
		t.Fatalf("entries %d", res.Entries)
	}
	if fi, err := os.Stat(filepath.Join(src, "up/dir/x.py")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("x.py: %v %v", fi, err)
	}
	rc, err := h.client.DownloadTar(ctx, filepath.Join(src, "up"))
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	tr := tar.NewReader(rc)
	got := map[string]string{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		got[hdr.Name] = string(b) + hdr.Linkname
	}
	want := map[string]string{"dir/": "", "dir/x.py": "print(1)\n", "top.txt": "top", "ln": "top.txt"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("downloaded %q = %q, want %q (all: %v)", k, got[k], v, got)
		}
	}
	// An entry that climbs out of the target is refused.
	buf.Reset()
	tw = tar.NewWriter(&buf)
	add(&tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Mode: 0o644}, "x")
	tw.Close()
	if _, err := h.client.UploadTar(ctx, filepath.Join(src, "up2"), &buf); !client.IsCode(err, api.CodeBadRequest) {
		t.Fatalf("escaping entry: %v", err)
	}
	if _, err := os.Stat(filepath.Join(src, "escape")); !os.IsNotExist(err) {
		t.Fatal("escaping entry was written")
	}
	// So is one written through a link the archive made to outside.
	outside := t.TempDir()
	buf.Reset()
	tw = tar.NewWriter(&buf)
	add(&tar.Header{Name: "esc", Typeflag: tar.TypeSymlink, Linkname: outside}, "")
	add(&tar.Header{Name: "esc/pwned", Typeflag: tar.TypeReg, Mode: 0o644}, "x")
	tw.Close()
	if _, err := h.client.UploadTar(ctx, filepath.Join(src, "up4"), &buf); !client.IsCode(err, api.CodeBadRequest) {
		t.Fatalf("entry through an escaping link: %v", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "pwned")); !os.IsNotExist(err) {
		t.Fatal("entry through an escaping link was written")
	}
	if _, err := h.client.UploadTar(ctx, filepath.Join(src, "up3"), strings.NewReader("not a tar")); !client.IsCode(err, api.CodeBadRequest) {
		t.Fatalf("garbage tar: %v", err)
	}
}

// TestFilesUploadLimit: an upload over the limit fails clearly and leaves
// nothing behind, not even the previous content changed.
func TestFilesUploadLimit(t *testing.T) {
	h := newHarness(t, func(c *daemonConfig) { c.MaxUploadBytes = 1 << 20 })
	ctx := t.Context()
	p := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(p, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := h.client.WriteFile(ctx, p, bytes.NewReader(make([]byte, 2<<20)), 0)
	if !client.IsCode(err, api.CodeTooLarge) {
		t.Fatalf("err = %v, want %s", err, api.CodeTooLarge)
	}
	if b, _ := os.ReadFile(p); string(b) != "old" {
		t.Fatalf("content changed to %d bytes", len(b))
	}
	entries, _ := os.ReadDir(filepath.Dir(p))
	if len(entries) != 1 {
		t.Fatalf("%d entries left, want 1", len(entries))
	}
}

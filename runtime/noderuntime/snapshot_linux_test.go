package noderuntime

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// TestWriteUpperDiff: an overlay upper directory becomes an OCI layer:
// whiteouts (0/0 devices) are .wh. entries, opaque directories get
// .wh..wh..opq, sandman's mount points are left out, and a whiteout over
// a link whose target does not resolve is still a deletion.
func TestWriteUpperDiff(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: overlay whiteouts are device nodes, opaque directories trusted xattrs")
	}
	lower, upper := t.TempDir(), t.TempDir()
	write := func(root, p, data string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	whiteout := func(p string) {
		t.Helper()
		if err := unix.Mknod(filepath.Join(upper, p), unix.S_IFCHR, 0); err != nil {
			t.Fatal(err)
		}
	}
	write(lower, "etc/keep", "k")
	write(lower, "etc/gone", "g")
	write(lower, "opaque/old", "o")
	if err := os.Symlink("/nonexistent/target", filepath.Join(lower, "etc/dangling")); err != nil {
		t.Fatal(err)
	}
	write(upper, "etc/new", "n")
	whiteout("etc/gone")
	whiteout("etc/dangling")
	whiteout("etc/never-was")
	if err := os.MkdirAll(filepath.Join(upper, "opaque"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(upper, "opaque"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Skipf("trusted xattrs on %s: %v", upper, err)
	}
	write(upper, "opaque/fresh", "f")
	write(upper, "data/file", "d")
	// What runc and the daemon's mounts leave in the upper directory.
	write(upper, ".sandman/sandman-daemon", "")
	if err := os.MkdirAll(filepath.Join(upper, ".sandman/state"), 0o755); err != nil {
		t.Fatal(err)
	}

	var buf bytes.Buffer
	if err := writeUpperDiff(t.Context(), &buf, lower, upper); err != nil {
		t.Fatal(err)
	}
	var names []string
	tr := tar.NewReader(&buf)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, hdr.Name)
	}
	for _, want := range []string{"etc/new", "etc/.wh.gone", "etc/.wh.dangling", "opaque/.wh..wh..opq", "opaque/fresh", "data/file"} {
		if !slices.Contains(names, want) {
			t.Errorf("no %s in the layer: %v", want, names)
		}
	}
	for _, name := range names {
		switch {
		case name == "etc/never-was", name == "etc/.wh.never-was":
			t.Errorf("a whiteout over nothing is in the layer: %v", names)
		case name == ".sandman/", filepath.Dir(filepath.Clean(name)) == ".sandman":
			t.Errorf("sandman's mount points are in the layer: %v", names)
		case name == "etc/keep":
			t.Errorf("an unchanged file is in the layer: %v", names)
		}
	}
}

package main

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

func TestSplitRemote(t *testing.T) {
	for _, tc := range []struct {
		in         string
		name, path string
		remote     bool
	}{
		{"box:/tmp/x", "box", "/tmp/x", true},
		{"./local", "", "./local", false},
		{"/abs/local", "", "/abs/local", false},
		{"dir/with:colon", "", "dir/with:colon", false},
		{"box:relative", "", "box:relative", false},
	} {
		name, path, remote := splitRemote(tc.in)
		if name != tc.name || path != tc.path || remote != tc.remote {
			t.Errorf("splitRemote(%q) = %q %q %v", tc.in, name, path, remote)
		}
	}
}

func TestTarRoundTrip(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	if err := os.MkdirAll(filepath.Join(src, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "a", "b", "f.txt"), []byte("hello"), 0o640); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("b/f.txt", filepath.Join(src, "a", "link")); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := writeTar(&buf, src); err != nil {
		t.Fatal(err)
	}
	if err := readTar(&buf, dst); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dst, "a", "link"))
	if err != nil || string(b) != "hello" {
		t.Fatalf("through the symlink: %q %v", b, err)
	}
	if fi, err := os.Stat(filepath.Join(dst, "a", "b", "f.txt")); err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("mode: %v %v", fi, err)
	}
}

func TestTarRefusesToEscape(t *testing.T) {
	dst, outside := t.TempDir(), t.TempDir()
	// What a hostile sandbox could send: a symlink out, then a file through it.
	var evil bytes.Buffer
	tw := tar.NewWriter(&evil)
	if err := tw.WriteHeader(&tar.Header{Name: "esc", Typeflag: tar.TypeSymlink, Linkname: outside}); err != nil {
		t.Fatal(err)
	}
	if err := tw.WriteHeader(&tar.Header{Name: "esc/pwned", Mode: 0o644, Size: 1, Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	_, _ = tw.Write([]byte("x"))
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := readTar(&evil, dst); err == nil {
		t.Fatal("a file written through an escaping symlink was accepted")
	}
	if _, err := os.Stat(filepath.Join(outside, "pwned")); err == nil {
		t.Fatal("the file landed outside the destination")
	}
}

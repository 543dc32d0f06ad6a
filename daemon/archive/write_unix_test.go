//go:build unix

package archive_test

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"github.com/sandman-dev/sandman/daemon/archive"
)

// TestWriteSkipsSpecialFiles: sockets and FIFOs are not archived (and
// reading a FIFO does not block the writer).
func TestWriteSkipsSpecialFiles(t *testing.T) {
	src, err := os.MkdirTemp("", "ar") // short: unix socket paths are limited
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(src) })
	l, err := net.Listen("unix", filepath.Join(src, "sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := syscall.Mkfifo(filepath.Join(src, "fifo"), 0o644); err != nil {
		t.Fatal(err)
	}
	writeFile(t, filepath.Join(src, "f"), "x", 0o644)
	var buf bytes.Buffer
	if err := archive.Write(&buf, src); err != nil {
		t.Fatal(err)
	}
	if got := entries(t, buf.Bytes()); !slices.Equal(got, []string{"f"}) {
		t.Fatalf("entries %q, want [f]", got)
	}
}

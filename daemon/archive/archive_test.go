package archive_test

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sandman-dev/sandman/daemon/archive"
)

var past = time.Date(2020, 5, 6, 7, 8, 9, 0, time.UTC)

func mkdir(t *testing.T, p string, mode fs.FileMode) {
	t.Helper()
	if err := os.MkdirAll(p, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func writeFile(t *testing.T, p, content string, mode fs.FileMode) {
	t.Helper()
	if err := os.WriteFile(p, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func symlink(t *testing.T, target, p string) {
	t.Helper()
	if err := os.Symlink(target, p); err != nil {
		t.Fatal(err)
	}
}

// entries lists an archive's entries as "name -> link" or "name".
func entries(t *testing.T, b []byte) []string {
	t.Helper()
	var out []string
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		e := hdr.Name
		if hdr.Linkname != "" {
			e += " -> " + hdr.Linkname
		}
		out = append(out, e)
	}
}

// TestRoundTrip: directories (named with a trailing slash), files and
// links come back with their content, modes and times; links stay links.
func TestRoundTrip(t *testing.T) {
	src, dst := t.TempDir(), filepath.Join(t.TempDir(), "dst")
	mkdir(t, filepath.Join(src, "a", "b"), 0o755)
	writeFile(t, filepath.Join(src, "a", "b", "f.txt"), "hello", 0o640)
	writeFile(t, filepath.Join(src, "run.sh"), "#!/bin/sh\n", 0o755)
	symlink(t, "b/f.txt", filepath.Join(src, "a", "link"))
	symlink(t, "/etc/passwd", filepath.Join(src, "abs")) // stored, never followed
	mkdir(t, filepath.Join(src, "ro"), 0o755)
	writeFile(t, filepath.Join(src, "ro", "inside"), "x", 0o444)
	mkdir(t, filepath.Join(src, "ro"), 0o555)
	for _, p := range []string{"a/b/f.txt", "run.sh", "ro/inside", "a/b", "ro", "a"} {
		if err := os.Chtimes(filepath.Join(src, p), past, past); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() { _ = os.Chmod(filepath.Join(dst, "ro"), 0o755) })

	var buf bytes.Buffer
	if err := archive.Write(&buf, src); err != nil {
		t.Fatal(err)
	}
	got := entries(t, buf.Bytes())
	slices.Sort(got)
	want := []string{"a/", "a/b/", "a/b/f.txt", "a/link -> b/f.txt", "abs -> /etc/passwd", "ro/", "ro/inside", "run.sh"}
	if !slices.Equal(got, want) {
		t.Fatalf("entries %q, want %q", got, want)
	}

	n, err := archive.Extract(bytes.NewReader(buf.Bytes()), dst)
	if err != nil {
		t.Fatal(err)
	}
	if n != len(want) {
		t.Errorf("extracted %d entries, want %d", n, len(want))
	}
	for _, tc := range []struct {
		path    string
		mode    fs.FileMode
		content string
	}{
		{"a/b/f.txt", 0o640, "hello"},
		{"run.sh", 0o755, "#!/bin/sh\n"},
		{"ro/inside", 0o444, "x"},
		{"a/b", fs.ModeDir | 0o755, ""},
		{"ro", fs.ModeDir | 0o555, ""},
	} {
		fi, err := os.Lstat(filepath.Join(dst, tc.path))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != tc.mode {
			t.Errorf("%s: mode %v, want %v", tc.path, fi.Mode(), tc.mode)
		}
		if !fi.ModTime().Equal(past) {
			t.Errorf("%s: mtime %v, want %v", tc.path, fi.ModTime(), past)
		}
		if !fi.IsDir() {
			if b, _ := os.ReadFile(filepath.Join(dst, tc.path)); string(b) != tc.content {
				t.Errorf("%s: content %q, want %q", tc.path, b, tc.content)
			}
		}
	}
	for link, target := range map[string]string{"a/link": "b/f.txt", "abs": "/etc/passwd"} {
		if got, err := os.Readlink(filepath.Join(dst, link)); err != nil || got != target {
			t.Errorf("%s: link to %q (%v), want %q", link, got, err, target)
		}
	}
}

// TestWriteThroughLinkedRoot: a directory named by a link is archived as
// the directory it leads to.
func TestWriteThroughLinkedRoot(t *testing.T) {
	base := t.TempDir()
	mkdir(t, filepath.Join(base, "real"), 0o755)
	writeFile(t, filepath.Join(base, "real", "f"), "x", 0o644)
	symlink(t, "real", filepath.Join(base, "link"))
	var buf bytes.Buffer
	if err := archive.Write(&buf, filepath.Join(base, "link")); err != nil {
		t.Fatal(err)
	}
	if got := entries(t, buf.Bytes()); !slices.Equal(got, []string{"f"}) {
		t.Fatalf("entries %q, want [f]", got)
	}
}

type entry struct {
	name, link string
	typ        byte
	body       string
}

func tarOf(t *testing.T, es ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range es {
		hdr := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.typ, Mode: 0o644, Size: int64(len(e.body))}
		if e.typ == tar.TypeDir {
			hdr.Mode = 0o755
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func reg(name, body string) entry  { return entry{name: name, typ: tar.TypeReg, body: body} }
func dir(name string) entry        { return entry{name: name, typ: tar.TypeDir} }
func sym(name, link string) entry  { return entry{name: name, link: link, typ: tar.TypeSymlink} }
func hard(name, link string) entry { return entry{name: name, link: link, typ: tar.TypeLink} }

// TestExtractRefusesToEscape: what a hostile sandbox could send to
// `sandmanctl cp` (or a caller to the daemon) lands inside the destination
// or is refused; nothing is ever written outside it.
func TestExtractRefusesToEscape(t *testing.T) {
	for _, tc := range []struct {
		name string
		// setup prepares the destination; outside is a sibling directory.
		setup   func(t *testing.T, dst, outside string)
		entries func(outside string) []entry
	}{
		{name: "absolute name", entries: func(outside string) []entry {
			return []entry{reg(filepath.Join(outside, "pwned"), "x")}
		}},
		{name: "dot-dot name", entries: func(string) []entry { return []entry{reg("../outside/pwned", "x")} }},
		{name: "dot-dot inside a name", entries: func(string) []entry { return []entry{reg("a/../../outside/pwned", "x")} }},
		{name: "dot-dot in a directory", entries: func(string) []entry { return []entry{dir("../outside/d/")} }},
		{name: "file through a link it made", entries: func(outside string) []entry {
			return []entry{sym("esc", outside), reg("esc/pwned", "x")}
		}},
		{name: "file through a relative link it made", entries: func(string) []entry {
			return []entry{sym("esc", "../outside"), reg("esc/pwned", "x")}
		}},
		{name: "directory through a link it made", entries: func(string) []entry {
			return []entry{sym("esc", "../outside"), dir("esc/d/"), reg("esc/d/pwned", "x")}
		}},
		{name: "file through a chain of links", entries: func(string) []entry {
			return []entry{dir("a/"), sym("a/up", ".."), sym("a/up2", "up/.."), reg("a/up2/outside/pwned", "x")}
		}},
		{name: "link through a link it made", entries: func(string) []entry {
			return []entry{sym("esc", "../outside"), sym("esc/pwned", "/etc/passwd")}
		}},
		{name: "hard link out", entries: func(string) []entry {
			return []entry{hard("pwned", "../outside/secret")}
		}},
		{name: "hard link through a link it made", entries: func(string) []entry {
			return []entry{sym("esc", "../outside"), hard("pwned", "esc/secret")}
		}},
		{name: "file through a link two levels up it made", entries: func(string) []entry {
			return []entry{dir("a/"), sym("a/evil", "../../outside"), reg("a/evil/passwd", "x")}
		}},
		{name: "directory and file through a link it made", entries: func(outside string) []entry {
			return []entry{sym("evil", outside), dir("evil/sub/"), reg("evil/sub/passwd", "x")}
		}},
		{name: "hard link with an absolute target", entries: func(outside string) []entry {
			return []entry{hard("pwned", filepath.Join(outside, "secret"))}
		}},
		{name: "file through a hard link to a link it made", entries: func(string) []entry {
			return []entry{sym("esc", "../outside"), hard("esc2", "esc"), reg("esc2/pwned", "x")}
		}},
		{name: "file through a link already there", setup: func(t *testing.T, dst, outside string) {
			symlink(t, outside, filepath.Join(dst, "esc"))
		}, entries: func(string) []entry { return []entry{reg("esc/pwned", "x")} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := t.TempDir()
			dst, outside := filepath.Join(base, "dst"), filepath.Join(base, "outside")
			mkdir(t, dst, 0o755)
			mkdir(t, outside, 0o755)
			writeFile(t, filepath.Join(outside, "secret"), "secret", 0o600)
			if tc.setup != nil {
				tc.setup(t, dst, outside)
			}
			_, err := archive.Extract(bytes.NewReader(tarOf(t, tc.entries(outside)...)), dst)
			if !errors.Is(err, archive.ErrUnsafe) {
				t.Errorf("err = %v, want ErrUnsafe", err)
			}
			left, err := os.ReadDir(outside)
			if err != nil {
				t.Fatal(err)
			}
			if len(left) != 1 || left[0].Name() != "secret" {
				t.Errorf("outside now holds %v", left)
			}
			if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "secret" {
				t.Errorf("outside/secret now reads %q", b)
			}
			others, _ := os.ReadDir(base)
			if len(others) != 2 {
				t.Errorf("the destination's parent now holds %v", others)
			}
		})
	}
}

// TestExtractReplacesNotFollows: a file or link already at an entry's name
// is replaced, never written through; links that stay inside are followed.
func TestExtractReplacesNotFollows(t *testing.T) {
	base := t.TempDir()
	dst, outside := filepath.Join(base, "dst"), filepath.Join(base, "outside")
	mkdir(t, dst, 0o755)
	mkdir(t, outside, 0o755)
	writeFile(t, filepath.Join(outside, "secret"), "secret", 0o600)
	symlink(t, filepath.Join(outside, "secret"), filepath.Join(dst, "f"))
	writeFile(t, filepath.Join(dst, "g"), "old", 0o644)
	n, err := archive.Extract(bytes.NewReader(tarOf(t,
		reg("f", "new f"),                      // replaces the link
		sym("g", "f"),                          // replaces the file
		dir("real/"),                           // a directory
		sym("in", "real"),                      // a link that stays inside...
		reg("in/x", "through"),                 // ...is followed
		hard("h", "f"),                         // a hard link between entries
		entry{name: "fifo", typ: tar.TypeFifo}, // skipped
		dir("./"),                              // the destination itself: not an entry
	)), dst)
	if err != nil {
		t.Fatal(err)
	}
	if n != 6 {
		t.Errorf("%d entries, want 6", n)
	}
	if b, _ := os.ReadFile(filepath.Join(outside, "secret")); string(b) != "secret" {
		t.Errorf("written through the link: outside reads %q", b)
	}
	for p, want := range map[string]string{"f": "new f", "g": "new f", "real/x": "through", "h": "new f"} {
		if b, err := os.ReadFile(filepath.Join(dst, p)); err != nil || string(b) != want {
			t.Errorf("%s = %q (%v), want %q", p, b, err, want)
		}
	}
	if fi, err := os.Lstat(filepath.Join(dst, "f")); err != nil || !fi.Mode().IsRegular() {
		t.Errorf("f is %v (%v), want a regular file", fi.Mode(), err)
	}
	if _, err := os.Lstat(filepath.Join(dst, "fifo")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("fifo: %v, want not made", err)
	}
	left, _ := os.ReadDir(dst)
	for _, e := range left {
		if strings.Contains(e.Name(), ".sandman-") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}

// TestExtractBadArchive: a stream that is not a whole tar archive says so.
func TestExtractBadArchive(t *testing.T) {
	whole := tarOf(t, reg("f", strings.Repeat("x", 4096)))
	for name, b := range map[string][]byte{
		"garbage":   []byte(strings.Repeat("not a tar ", 100)),
		"truncated": whole[:512+100],
	} {
		t.Run(name, func(t *testing.T) {
			dst := t.TempDir()
			if _, err := archive.Extract(bytes.NewReader(b), dst); !errors.Is(err, archive.ErrBadArchive) {
				t.Fatalf("err = %v, want ErrBadArchive", err)
			}
			if left, _ := os.ReadDir(dst); len(left) != 0 {
				t.Errorf("left behind: %v", left)
			}
		})
	}
}

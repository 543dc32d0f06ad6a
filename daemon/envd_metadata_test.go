package daemon_test

import (
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/sandman-dev/sandman/daemon/envd/spec/filesystem"
)

// writtenMeta is one file of an upload's answer, with its metadata.
type writtenMeta struct {
	Path     string            `json:"path"`
	Metadata map[string]string `json:"metadata"`
}

func writtenWithMeta(t *testing.T, b []byte) []writtenMeta {
	t.Helper()
	var out []writtenMeta
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("upload answer %q: %v", b, err)
	}
	return out
}

// xattrSupported skips unless dir's filesystem keeps user extended
// attributes (the metadata tests read and write them directly).
func xattrSupported(t *testing.T, dir string) {
	t.Helper()
	p := filepath.Join(dir, ".xattr-probe")
	writeTestFile(t, p, "")
	defer os.Remove(p)
	if err := unix.Setxattr(p, "user.probe", []byte("1"), 0); err != nil {
		t.Skipf("%s has no user extended attributes (%v)", dir, err)
	}
}

// xattrs is p's user.* attributes.
func xattrs(t *testing.T, p string) map[string]string {
	t.Helper()
	buf := make([]byte, 64<<10)
	n, err := unix.Listxattr(p, buf)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if !strings.HasPrefix(name, "user.") {
			continue
		}
		v := make([]byte, 64<<10)
		m, err := unix.Getxattr(p, name, v)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = string(v[:m])
	}
	return out
}

// TestEnvdFileMetadata: metadata given on write (X-Metadata-* headers, as
// the SDK sends them) is kept as user.e2b.* attributes, shown by Stat,
// ListDir and the upload's answer, kept by a rename, replaced (or cleared)
// by the next write, as envd 0.6.2 does.
func TestEnvdFileMetadata(t *testing.T) {
	e := newFSEnv(t)
	xattrSupported(t, e.dir)
	ctx := t.Context()
	fs := e.fs(testToken, "", connect.WithProtoJSON())
	octet := func(kv ...string) http.Header {
		return hdr(append([]string{"Content-Type", "application/octet-stream"}, kv...)...)
	}
	stat := func(p string) map[string]string {
		t.Helper()
		res, err := fs.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: p}))
		if err != nil {
			t.Fatal(err)
		}
		return res.Msg.GetEntry().GetMetadata()
	}
	want := map[string]string{"author": "mish", "purpose": "a test: with spaces ~!"}
	p := filepath.Join(e.dir, "m/a.txt")

	// Written with metadata: the keys lowercased, as envd does; a key sent
	// twice keeps its first value; X-Metadata- alone is ignored.
	h := octet("X-Metadata-Author", "mish", "x-metadata-PURPOSE", "a test: with spaces ~!", "X-Metadata-", "ignored")
	h.Add("X-Metadata-Author", "second")
	resp, b := e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"path": {"m/a.txt"}}, header: h, body: strings.NewReader("hello")})
	wantStatus(t, "upload with metadata", resp, b, 200, "")
	if got := writtenWithMeta(t, b); len(got) != 1 || got[0].Path != p || !maps.Equal(got[0].Metadata, want) {
		t.Errorf("upload answered %s, want metadata %v", b, want)
	}
	if got := xattrs(t, p); !maps.Equal(got, map[string]string{"user.e2b.author": "mish", "user.e2b.purpose": "a test: with spaces ~!"}) {
		t.Errorf("on disk: %v", got)
	}
	if got := stat(p); !maps.Equal(got, want) {
		t.Errorf("Stat: metadata %v, want %v", got, want)
	}
	// Other user.* attributes are the sandbox's own: neither shown nor
	// touched.
	if err := unix.Setxattr(p, "user.other", []byte("tool"), 0); err != nil {
		t.Fatal(err)
	}
	res, err := fs.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: filepath.Dir(p)}))
	if err != nil {
		t.Fatal(err)
	}
	if es := res.Msg.GetEntries(); len(es) != 1 || !maps.Equal(es[0].GetMetadata(), want) {
		t.Errorf("ListDir: %v", es)
	}

	// A rename keeps it.
	moved := filepath.Join(e.dir, "n/b.txt")
	mres, err := fs.Move(ctx, connect.NewRequest(&filesystem.MoveRequest{Source: p, Destination: moved}))
	if err != nil {
		t.Fatal(err)
	}
	if got := mres.Msg.GetEntry().GetMetadata(); !maps.Equal(got, want) {
		t.Errorf("Move's entry: metadata %v", got)
	}
	if got := stat(moved); !maps.Equal(got, want) {
		t.Errorf("Stat after Move: metadata %v", got)
	}

	// Another write replaces it: keys it does not name are gone.
	resp, b = e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"path": {moved}}, header: octet("X-Metadata-Version", "2"), body: strings.NewReader("v2")})
	wantStatus(t, "overwrite with other metadata", resp, b, 200, "")
	if got := stat(moved); !maps.Equal(got, map[string]string{"version": "2"}) {
		t.Errorf("after an overwrite with version=2: %v", got)
	}
	// A write without any clears it, and keeps the sandbox's own.
	resp, b = e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"path": {moved}}, header: octet(), body: strings.NewReader("v3")})
	wantStatus(t, "overwrite without metadata", resp, b, 200, "")
	if got := writtenWithMeta(t, b); len(got) != 1 || got[0].Metadata != nil || strings.Contains(string(b), "metadata") {
		t.Errorf("upload without metadata answered %s", b)
	}
	if got := stat(moved); len(got) != 0 {
		t.Errorf("after an overwrite without metadata: %v", got)
	}
	if got := xattrs(t, moved); !maps.Equal(got, map[string]string{"user.other": "tool"}) {
		t.Errorf("on disk after clearing: %v", got)
	}
	if b, _ := os.ReadFile(moved); string(b) != "v3" {
		t.Errorf("file holds %q", b)
	}

	// Multipart: every file gets the same metadata.
	body, ctype := multipartBody(t, [2]string{"mp/1.txt", "1"}, [2]string{"mp/2.txt", "2"})
	resp, b = e.do(t, restCall{method: "POST", path: "/files", header: hdr("Content-Type", ctype, "X-Metadata-Batch", "7"), body: body})
	wantStatus(t, "multipart with metadata", resp, b, 200, "")
	for _, w := range writtenWithMeta(t, b) {
		if !maps.Equal(w.Metadata, map[string]string{"batch": "7"}) || !maps.Equal(stat(w.Path), w.Metadata) {
			t.Errorf("%s: answered %v, Stat %v", w.Path, w.Metadata, stat(w.Path))
		}
	}

	// Set inside the sandbox: a directory's shows too; a value that is not
	// UTF-8 is left out (a protobuf string must be), not the listing.
	dir := filepath.Join(e.dir, "mp")
	if err := unix.Setxattr(dir, "user.e2b.kind", []byte("batch"), 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(dir, "1.txt"), "user.e2b.bad", []byte{0xff, 0xfe}, 0); err != nil {
		t.Fatal(err)
	}
	if got := stat(dir); !maps.Equal(got, map[string]string{"kind": "batch"}) {
		t.Errorf("directory: %v", got)
	}
	for _, codec := range fsCodecs {
		res, err := e.fs(testToken, "", codec.opts...).ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: dir}))
		if err != nil {
			t.Fatalf("%s: ListDir with a non-UTF-8 value: %v", codec.name, err)
		}
		if es := res.Msg.GetEntries(); len(es) != 2 || !maps.Equal(es[0].GetMetadata(), map[string]string{"batch": "7"}) {
			t.Errorf("%s: ListDir: %v", codec.name, es)
		}
	}

	// A symbolic link shows what it leads to, as envd.
	if err := os.Symlink(filepath.Join(dir, "2.txt"), filepath.Join(e.dir, "link")); err != nil {
		t.Fatal(err)
	}
	if got := stat(filepath.Join(e.dir, "link")); !maps.Equal(got, map[string]string{"batch": "7"}) {
		t.Errorf("link: %v", got)
	}

	// A watch's entries carry it.
	w, err := startWatch(t, fs, connect.NewRequest(&filesystem.WatchDirRequest{Path: dir, IncludeEntry: true}))
	if err != nil {
		t.Fatal(err)
	}
	resp, b = e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"path": {filepath.Join(dir, "3.txt")}}, header: octet("X-Metadata-Seen", "yes"), body: strings.NewReader("3")})
	wantStatus(t, "upload into a watched directory", resp, b, 200, "")
	ev := w.waitFor(t, filesystem.EventType_EVENT_TYPE_WRITE, "3.txt")
	if got := ev.GetEntry().GetMetadata(); !maps.Equal(got, map[string]string{"seen": "yes"}) {
		t.Errorf("watch entry of 3.txt: metadata %v", got)
	}
}

// TestEnvdFileMetadataRefused: metadata that breaks envd's rules, or that
// the file cannot hold, fails the write with a message and writes
// nothing; without metadata the same files are written as before.
func TestEnvdFileMetadataRefused(t *testing.T) {
	e := newFSEnv(t)
	xattrSupported(t, e.dir)
	writeTestFile(t, filepath.Join(e.dir, "keep.txt"), "kept")
	if err := unix.Setxattr(filepath.Join(e.dir, "keep.txt"), "user.e2b.old", []byte("1"), 0); err != nil {
		t.Fatal(err)
	}
	octet := func(kv ...string) http.Header {
		return hdr(append([]string{"Content-Type", "application/octet-stream"}, kv...)...)
	}
	many := []string{}
	for i := range 20 {
		many = append(many, "X-Metadata-K"+strings.Repeat("x", i), strings.Repeat("v", 240))
	}
	for _, tc := range []struct {
		name, path string
		header     http.Header
		msg        string
	}{
		{"a value that is not ASCII", "new.txt", octet("X-Metadata-City", "Zürich"), "printable US-ASCII"},
		{"a key over 246 bytes", "new.txt", octet("X-Metadata-"+strings.Repeat("k", 247), "v"), "over the limit of 246"},
		{"more than 4096 bytes", "new.txt", octet(many...), "over the limit of 4096"},
		{"on an existing file", "keep.txt", octet("X-Metadata-City", "Zürich"), "printable US-ASCII"},
		{"on a device", "/dev/null", octet("X-Metadata-A", "b"), "character device"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"path": {tc.path}}, header: tc.header, body: strings.NewReader("new")})
			wantStatus(t, tc.name, resp, b, 400, tc.msg)
		})
	}
	if _, err := os.Stat(filepath.Join(e.dir, "new.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused write left new.txt (%v)", err)
	}
	if b, _ := os.ReadFile(filepath.Join(e.dir, "keep.txt")); string(b) != "kept" {
		t.Errorf("a refused write changed keep.txt to %q", b)
	}
	if got := xattrs(t, filepath.Join(e.dir, "keep.txt")); !maps.Equal(got, map[string]string{"user.e2b.old": "1"}) {
		t.Errorf("a refused write changed keep.txt's metadata to %v", got)
	}
	// Without metadata, a device is written as before.
	resp, b := e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"path": {"/dev/null"}}, header: octet(), body: strings.NewReader("x")})
	wantStatus(t, "write /dev/null", resp, b, 200, "")

	// A filesystem without user extended attributes (ramfs has none).
	ram := t.TempDir()
	if err := unix.Mount("none", ram, "ramfs", 0, ""); err != nil {
		t.Logf("no ramfs to test a filesystem without user extended attributes: %v", err)
		return
	}
	t.Cleanup(func() { _ = unix.Unmount(ram, unix.MNT_DETACH) })
	writeTestFile(t, filepath.Join(ram, "old.txt"), "old")
	for _, p := range []string{filepath.Join(ram, "new.txt"), filepath.Join(ram, "sub/new.txt"), filepath.Join(ram, "old.txt")} {
		resp, b := e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"path": {p}}, header: octet("X-Metadata-A", "b"), body: strings.NewReader("new")})
		wantStatus(t, "metadata on ramfs", resp, b, 400, "no user extended attributes")
	}
	for _, p := range []string{"new.txt", "sub"} {
		if _, err := os.Lstat(filepath.Join(ram, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a refused write left %s (%v)", p, err)
		}
	}
	if b, _ := os.ReadFile(filepath.Join(ram, "old.txt")); string(b) != "old" {
		t.Errorf("a refused write changed old.txt to %q", b)
	}
	resp, b = e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"path": {filepath.Join(ram, "old.txt")}}, header: octet(), body: strings.NewReader("new")})
	wantStatus(t, "write on ramfs without metadata", resp, b, 200, "")
	res, err := e.fs(testToken, "").Stat(t.Context(), connect.NewRequest(&filesystem.StatRequest{Path: filepath.Join(ram, "old.txt")}))
	if err != nil || len(res.Msg.GetEntry().GetMetadata()) != 0 {
		t.Errorf("Stat on ramfs: %v, %v", res, err)
	}
}

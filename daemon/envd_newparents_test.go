package daemon_test

import (
	"bytes"
	"errors"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/sandman-dev/sandman/daemon"
	"github.com/sandman-dev/sandman/daemon/envd/spec/filesystem"
)

// TestEnvdFilesAsUserNewParents: a user writing where only root may make
// the parent gets it made and handed over, as on E2B (the SDK's
// write([...]) with one file under a new top-level directory), and only
// that: an existing directory of root's is never handed over, a directory
// the user cannot reach is never made, and a failed call takes back what
// it made.
func TestEnvdFilesAsUserNewParents(t *testing.T) {
	uid, gid := rootAndNobody(t)
	e := newFSEnv(t, func(c *daemon.Config) { c.MaxUploadBytes = 1 << 20 })
	d := e.dir
	openTo(t, d, 0o755) // root's, 0755: nobody may not make entries in it
	writeMode(t, filepath.Join(d, "etc/conf"), "root's", 0o644)
	writeMode(t, filepath.Join(d, "private/inner"), "hidden", 0o644)
	if err := os.Chmod(filepath.Join(d, "private"), 0o700); err != nil {
		t.Fatal(err)
	}
	drop := filepath.Join(d, "drop")
	if err := os.Mkdir(drop, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(drop, uid, gid); err != nil {
		t.Fatal(err)
	}
	// nobody's own links: to root's 0700 directory, and to root's 0755 one.
	if err := os.Symlink(filepath.Join(d, "private"), filepath.Join(drop, "to-private")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(d, "etc"), filepath.Join(drop, "to-etc")); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(filepath.Join(drop, "to-private"), uid, gid); err != nil {
		t.Fatal(err)
	}
	nobodyOwns := func(t *testing.T, ps ...string) {
		t.Helper()
		for _, p := range ps {
			if got := ownerOf(t, filepath.Join(d, p)); got != [2]int{uid, gid} {
				t.Errorf("%s owned by %d:%d, want nobody's %d:%d", p, got[0], got[1], uid, gid)
			}
		}
	}
	rootOwns := func(t *testing.T, ps ...string) {
		t.Helper()
		for _, p := range ps {
			if got := ownerOf(t, filepath.Join(d, p)); got != [2]int{0, 0} {
				t.Errorf("%s owned by %d:%d, want root's", p, got[0], got[1])
			}
		}
	}
	missing := func(t *testing.T, ps ...string) {
		t.Helper()
		for _, p := range ps {
			if _, err := os.Lstat(filepath.Join(d, p)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("%s exists after a refused call (%v)", p, err)
			}
		}
	}
	asNobody := url.Values{"username": {"nobody"}}

	t.Run("many files, one under a new top-level directory", func(t *testing.T) {
		body, ctype := multipartBody(t,
			[2]string{filepath.Join(drop, "a.txt"), "a"},
			[2]string{filepath.Join(d, "newdir/b.txt"), "b"},
			[2]string{filepath.Join(d, "newdir/deeper/c.txt"), "c"})
		resp, b := e.do(t, restCall{method: "POST", path: "/files", query: asNobody, header: hdr("Content-Type", ctype), body: body})
		wantStatus(t, "write([...]) as nobody", resp, b, 200, "")
		if got := written(t, b); len(got) != 3 {
			t.Fatalf("answered %+v", got)
		}
		nobodyOwns(t, "drop/a.txt", "newdir", "newdir/b.txt", "newdir/deeper", "newdir/deeper/c.txt")
		rootOwns(t, ".")
		if fi, err := os.Stat(filepath.Join(d, "newdir")); err != nil || fi.Mode().Perm() != 0o755 {
			t.Errorf("newdir: %v, %v; want mode 0755", fi, err)
		}
		if b, _ := os.ReadFile(filepath.Join(d, "newdir/deeper/c.txt")); string(b) != "c" {
			t.Errorf("c.txt holds %q", b)
		}
	})

	t.Run("an existing directory of root's is not handed over", func(t *testing.T) {
		resp, b := e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"username": {"nobody"}, "path": {filepath.Join(d, "etc/new/x")}},
			header: hdr("Content-Type", "application/octet-stream"), body: strings.NewReader("x")})
		wantStatus(t, "write under root's etc", resp, b, 200, "")
		nobodyOwns(t, "etc/new", "etc/new/x")
		rootOwns(t, "etc", "etc/conf")
		resp, b = e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"username": {"nobody"}, "path": {filepath.Join(d, "etc/direct")}},
			header: hdr("Content-Type", "application/octet-stream"), body: strings.NewReader("x")})
		wantStatus(t, "write straight into root's etc", resp, b, 403, "permission denied")
		missing(t, "etc/direct")
		rootOwns(t, "etc")
	})

	t.Run("a directory nobody cannot reach is not made", func(t *testing.T) {
		for _, p := range []string{filepath.Join(d, "private/new/x"), filepath.Join(drop, "to-private/new/x")} {
			resp, b := e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"username": {"nobody"}, "path": {p}},
				header: hdr("Content-Type", "application/octet-stream"), body: strings.NewReader("x")})
			wantStatus(t, "write under root's 0700 directory", resp, b, 403, "permission denied")
		}
		missing(t, "private/new")
		rootOwns(t, "private")
	})

	t.Run("through a link, what the link leads to gets the rule", func(t *testing.T) {
		resp, b := e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"username": {"nobody"}, "path": {filepath.Join(drop, "to-etc/linked/x")}},
			header: hdr("Content-Type", "application/octet-stream"), body: strings.NewReader("x")})
		wantStatus(t, "write through a link", resp, b, 200, "")
		nobodyOwns(t, "etc/linked", "etc/linked/x")
		rootOwns(t, "etc")
	})

	t.Run("a failed write takes back the directories it made", func(t *testing.T) {
		resp, b := e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"username": {"nobody"}, "path": {filepath.Join(d, "big/sub/x")}},
			header: hdr("Content-Type", "application/octet-stream"), body: bytes.NewReader(make([]byte, 2<<20)), noLength: true})
		wantStatus(t, "a write over the limit", resp, b, 413, "limit")
		missing(t, "big")
		resp, b = e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"username": {"nobody"}, "path": {filepath.Join(d, "etc/conf/x")}},
			header: hdr("Content-Type", "application/octet-stream"), body: strings.NewReader("x")})
		wantStatus(t, "a write under a file", resp, b, 400, "not a directory")
	})

	t.Run("MakeDir and Move", func(t *testing.T) {
		ctx := t.Context()
		nobody := e.fs(testToken, "nobody")
		res, err := nobody.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: filepath.Join(d, "md/a")}))
		if err != nil {
			t.Fatal(err)
		}
		if o := res.Msg.GetEntry().GetOwner(); o != "nobody" {
			t.Errorf("MakeDir's entry owned by %q", o)
		}
		nobodyOwns(t, "md", "md/a")
		_, err = nobody.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: filepath.Join(d, "md")}))
		wantFSCode(t, "MakeDir again", err, connect.CodeAlreadyExists)
		_, err = nobody.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: filepath.Join(d, "etc")}))
		wantFSCode(t, "MakeDir of root's etc", err, connect.CodeAlreadyExists)
		rootOwns(t, "etc")

		writeMode(t, filepath.Join(drop, "mv.txt"), "moved", 0o644)
		if err := os.Chown(filepath.Join(drop, "mv.txt"), uid, gid); err != nil {
			t.Fatal(err)
		}
		if _, err := nobody.Move(ctx, connect.NewRequest(&filesystem.MoveRequest{Source: filepath.Join(drop, "mv.txt"), Destination: filepath.Join(d, "mv/in/mv.txt")})); err != nil {
			t.Fatal(err)
		}
		nobodyOwns(t, "mv", "mv/in", "mv/in/mv.txt")
		// A move that fails takes back what it made: a missing source is
		// found before anything is made; one nobody may not move, after.
		_, err = nobody.Move(ctx, connect.NewRequest(&filesystem.MoveRequest{Source: filepath.Join(drop, "nope"), Destination: filepath.Join(d, "mv2/x")}))
		wantFSCode(t, "Move of a missing file", err, connect.CodeNotFound)
		_, err = nobody.Move(ctx, connect.NewRequest(&filesystem.MoveRequest{Source: filepath.Join(d, "etc/conf"), Destination: filepath.Join(d, "mv3/conf")}))
		wantFSCode(t, "Move of root's file", err, connect.CodePermissionDenied)
		missing(t, "mv2", "mv3")
		if b, _ := os.ReadFile(filepath.Join(d, "etc/conf")); string(b) != "root's" {
			t.Errorf("root's file now holds %q", b)
		}
	})
}

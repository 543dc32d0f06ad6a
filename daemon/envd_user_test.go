package daemon_test

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	"github.com/sandman-dev/sandman/daemon"
	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/envd/spec/filesystem"
)

// rootAndNobody skips unless the test runs as root on a machine whose
// /etc/passwd has nobody (the daemon reads the sandbox's own, here the
// machine's), and returns nobody's uid and gid.
func rootAndNobody(t *testing.T) (uid, gid int) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("acting as another user needs a root daemon (the unit tier may run unprivileged; the root tier runs it)")
	}
	b, _ := os.ReadFile("/etc/passwd")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Split(line, ":"); len(f) >= 7 && f[0] == "nobody" {
			uid, _ = strconv.Atoi(f[2])
			gid, _ = strconv.Atoi(f[3])
			return uid, gid
		}
	}
	t.Skip("no user nobody in /etc/passwd")
	return 0, 0
}

// openTo lets other users into dir, a directory of t.TempDir (which makes
// it, and the directory above, root's and 0700): the one above becomes
// 0755, dir gets mode.
func openTo(t *testing.T, dir string, mode os.FileMode) {
	t.Helper()
	for _, c := range []struct {
		dir  string
		mode os.FileMode
	}{{filepath.Dir(dir), 0o755}, {dir, mode}} {
		if err := os.Chmod(c.dir, c.mode); err != nil {
			t.Fatal(err)
		}
	}
}

// writeMode writes a root-owned file with exactly mode.
func writeMode(t *testing.T, p, content string, mode os.FileMode) {
	t.Helper()
	writeTestFile(t, p, content)
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
}

func ownerOf(t *testing.T, p string) [2]int {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return [2]int{int(st.Uid), int(st.Gid)}
}

// TestEnvdFilesAsUser: a file call that names a user runs with that
// user's credentials, so the kernel's permission checks apply to it (a
// root daemon's overrides do not), for REST and Connect alike; root and
// the default user keep the daemon's.
func TestEnvdFilesAsUser(t *testing.T) {
	uid, gid := rootAndNobody(t)
	e := newFSEnv(t)
	d := e.dir
	openTo(t, d, 0o755)
	secret := filepath.Join(d, "secret")
	writeMode(t, secret, "root only", 0o600)
	writeMode(t, filepath.Join(d, "open"), "anyone", 0o644)
	writeMode(t, filepath.Join(d, "private/inner"), "hidden", 0o644)
	if err := os.Chmod(filepath.Join(d, "private"), 0o700); err != nil {
		t.Fatal(err)
	}
	drop := filepath.Join(d, "drop")
	if err := os.Mkdir(drop, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(drop, 0o777); err != nil {
		t.Fatal(err)
	}

	t.Run("REST", func(t *testing.T) {
		octet := hdr("X-Access-Token", testToken, "Content-Type", "application/octet-stream")
		for _, tc := range []struct {
			name   string
			call   restCall
			status int
			body   string // the download's bytes, or the error's words
		}{
			{"nobody reads root's 0600 file", restCall{method: "GET", path: "/files", query: url.Values{"path": {secret}, "username": {"nobody"}}}, 403, "permission denied"},
			{"nobody reads a file in root's 0700 directory", restCall{method: "GET", path: "/files", query: url.Values{"path": {filepath.Join(d, "private/inner")}, "username": {"nobody"}}}, 403, "permission denied"},
			{"nobody reads a 0644 file", restCall{method: "GET", path: "/files", query: url.Values{"path": {filepath.Join(d, "open")}, "username": {"nobody"}}}, 200, "anyone"},
			{"root reads root's 0600 file", restCall{method: "GET", path: "/files", query: url.Values{"path": {secret}, "username": {"root"}}}, 200, "root only"},
			{"the default user reads root's 0600 file", restCall{method: "GET", path: "/files", query: url.Values{"path": {"secret"}}}, 200, "root only"},
			{"nobody overwrites root's 0600 file", restCall{method: "POST", path: "/files", query: url.Values{"path": {secret}, "username": {"nobody"}}, header: octet, body: strings.NewReader("pwned")}, 403, "permission denied"},
			{"nobody writes into root's 0700 directory", restCall{method: "POST", path: "/files", query: url.Values{"path": {filepath.Join(d, "private/new")}, "username": {"nobody"}}, header: octet, body: strings.NewReader("x")}, 403, "permission denied"},
			{"nobody writes into root's 0755 directory", restCall{method: "POST", path: "/files", query: url.Values{"path": {filepath.Join(d, "mine")}, "username": {"nobody"}}, header: octet, body: strings.NewReader("x")}, 403, "permission denied"},
			{"nobody writes under root's 0700 directory", restCall{method: "POST", path: "/files", query: url.Values{"path": {filepath.Join(d, "private/newdir/x")}, "username": {"nobody"}}, header: octet, body: strings.NewReader("x")}, 403, "permission denied"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				resp, b := e.do(t, tc.call)
				wantStatus(t, tc.name, resp, b, tc.status, tc.body)
				if tc.status == 200 && tc.call.method == "GET" && string(b) != tc.body {
					t.Errorf("read %q, want %q", b, tc.body)
				}
			})
		}
		if b, _ := os.ReadFile(secret); string(b) != "root only" {
			t.Errorf("root's file now holds %q", b)
		}
		for _, p := range []string{"private/new", "private/newdir", "mine"} {
			if _, err := os.Lstat(filepath.Join(d, p)); err == nil {
				t.Errorf("a refused upload left %s", p)
			}
		}

		// What nobody creates is nobody's, parents included.
		p := filepath.Join(drop, "up/new.txt")
		resp, b := e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"path": {p}, "username": {"nobody"}}, header: octet, body: strings.NewReader("x")})
		wantStatus(t, "upload as nobody", resp, b, 200, "")
		for _, q := range []string{filepath.Dir(p), p} {
			if got := ownerOf(t, q); got != [2]int{uid, gid} {
				t.Errorf("%s owned by %d:%d, want %d:%d", q, got[0], got[1], uid, gid)
			}
		}
	})

	t.Run("Connect", func(t *testing.T) {
		ctx := t.Context()
		for _, codec := range fsCodecs {
			t.Run(codec.name, func(t *testing.T) {
				nobody := e.fs(testToken, "nobody", codec.opts...)
				root := e.fs(testToken, "root", codec.opts...)
				for _, tc := range []struct {
					name string
					call func() error
				}{
					{"stat in root's 0700 directory", func() error {
						_, err := nobody.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: filepath.Join(d, "private/inner")}))
						return err
					}},
					{"list root's 0700 directory", func() error {
						_, err := nobody.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: filepath.Join(d, "private")}))
						return err
					}},
					{"make a directory in root's 0700 directory", func() error {
						_, err := nobody.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: filepath.Join(d, "private/nd/sub")}))
						return err
					}},
					{"move root's file out of root's 0755 directory", func() error {
						_, err := nobody.Move(ctx, connect.NewRequest(&filesystem.MoveRequest{Source: secret, Destination: filepath.Join(drop, "stolen")}))
						return err
					}},
					{"remove root's file from root's 0755 directory", func() error {
						_, err := nobody.Remove(ctx, connect.NewRequest(&filesystem.RemoveRequest{Path: secret}))
						return err
					}},
					{"watch root's 0700 directory", func() error {
						_, err := startWatch(t, nobody, connect.NewRequest(&filesystem.WatchDirRequest{Path: filepath.Join(d, "private")}))
						return err
					}},
					{"create a watcher on root's 0700 directory", func() error {
						_, err := nobody.CreateWatcher(ctx, connect.NewRequest(&filesystem.CreateWatcherRequest{Path: filepath.Join(d, "private")}))
						return err
					}},
				} {
					t.Run(tc.name, func(t *testing.T) {
						err := tc.call()
						wantFSCode(t, tc.name, err, connect.CodePermissionDenied)
						if !strings.Contains(err.Error(), "permission denied") {
							t.Errorf("the error does not say why: %v", err)
						}
					})
				}
				if b, err := os.ReadFile(secret); err != nil || string(b) != "root only" {
					t.Errorf("root's file after nobody's calls: %q, %v", b, err)
				}
				for _, p := range []string{"private/nd", "drop/stolen"} {
					if _, err := os.Lstat(filepath.Join(d, p)); err == nil {
						t.Errorf("a refused call left %s", p)
					}
				}
				// Root is root: the same calls go through.
				if _, err := root.Stat(ctx, connect.NewRequest(&filesystem.StatRequest{Path: filepath.Join(d, "private/inner")})); err != nil {
					t.Errorf("stat as root: %v", err)
				}
				res, err := root.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: filepath.Join(d, "private")}))
				if err != nil || len(res.Msg.GetEntries()) != 1 {
					t.Errorf("list as root: %v, %v", res, err)
				}
			})
		}

		// A directory nobody makes is nobody's; one it lists shows what it
		// may see.
		nobody := e.fs(testToken, "nobody")
		p := filepath.Join(drop, "m/n")
		if _, err := nobody.MakeDir(ctx, connect.NewRequest(&filesystem.MakeDirRequest{Path: p})); err != nil {
			t.Fatal(err)
		}
		for _, q := range []string{filepath.Dir(p), p} {
			if got := ownerOf(t, q); got != [2]int{uid, gid} {
				t.Errorf("%s owned by %d:%d, want %d:%d", q, got[0], got[1], uid, gid)
			}
		}
		res, err := nobody.ListDir(ctx, connect.NewRequest(&filesystem.ListDirRequest{Path: d, Depth: 2}))
		if err != nil {
			t.Fatal(err)
		}
		for _, en := range res.Msg.GetEntries() {
			if en.GetPath() == filepath.Join(d, "private/inner") {
				t.Errorf("nobody's listing shows %s, inside root's 0700 directory", en.GetPath())
			}
		}
	})

	t.Run("recursive watch skips what its user may not read", func(t *testing.T) {
		nobody := e.fs(testToken, "nobody")
		w, err := startWatch(t, nobody, connect.NewRequest(&filesystem.WatchDirRequest{Path: drop, Recursive: true}))
		if err != nil {
			t.Fatal(err)
		}
		hidden := filepath.Join(drop, "hidden")
		if err := os.Mkdir(hidden, 0o700); err != nil {
			t.Fatal(err)
		}
		w.waitFor(t, filesystem.EventType_EVENT_TYPE_CREATE, "hidden")
		writeTestFile(t, filepath.Join(hidden, "inner"), "x")
		writeTestFile(t, filepath.Join(drop, "after"), "x")
		// One inotify queue keeps its order: had hidden been watched, its
		// event would come before after's.
		for {
			m, ok := <-w.msgs
			if !ok {
				t.Fatalf("the watch ended: %v", w.err)
			}
			ev := m.GetFilesystem()
			if ev == nil {
				continue
			}
			if strings.HasPrefix(ev.GetName(), "hidden/") {
				t.Fatalf("nobody's watch reported %s, inside root's 0700 directory", ev.GetName())
			}
			if ev.GetName() == "after" {
				break
			}
		}
	})
}

// TestEnvdFilesAsUserConcurrent: calls as another user, many at once, and
// the daemon's own calls between them: none of the daemon's own ever runs
// with a user's credentials (each switch is undone before its thread runs
// anything else).
func TestEnvdFilesAsUserConcurrent(t *testing.T) {
	rootAndNobody(t)
	e := newFSEnv(t)
	openTo(t, e.dir, 0o755)
	secret := filepath.Join(e.dir, "secret")
	writeMode(t, secret, "root only", 0o600)
	get := func(user string) (int, string, error) {
		q := url.Values{"path": {secret}}
		if user != "" {
			q.Set("username", user)
		}
		req, err := http.NewRequestWithContext(t.Context(), "GET", e.url+"/files?"+q.Encode(), nil)
		if err != nil {
			return 0, "", err
		}
		req.Header.Set("X-Access-Token", testToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	var wg sync.WaitGroup
	errs := make(chan error, 400)
	for i := range 400 {
		user, want := "", http.StatusOK
		if i%2 == 0 {
			user, want = "nobody", http.StatusForbidden
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, body, err := get(user)
			if err == nil && status != want {
				err = fmt.Errorf("as %q: %d %s, want %d", user, status, body, want)
			}
			if err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestEnvdDefaultUser: with api.EnvEnvdUser in the sandbox's environment,
// envd calls that name no user act as that user (E2B's default user: a
// root daemon runs them as it), for commands and files alike; a call that
// names root is root's.
func TestEnvdDefaultUser(t *testing.T) {
	uid, gid := rootAndNobody(t)
	withDefault := func(c *daemon.Config) { c.Env = append(c.Env, api.EnvEnvdUser+"=nobody") }

	// The sandbox's directory is where the default user's commands start
	// (a template's workdir), not its home.
	work := t.TempDir()
	openTo(t, work, 0o755)
	h := newEnvdHarness(t, withDefault, func(c *daemon.Config) { c.Dir = work })
	s := start(t, t.Context(), h.json(), shellReq(`echo "$(id -u):$(id -g) $USER $(pwd)"`))
	if end := s.wait(t); end.GetExitCode() != 0 || strings.TrimSpace(s.stdout.String()) != fmt.Sprintf("%d:%d nobody %s", uid, gid, work) {
		t.Errorf("a command naming no user ran as %q (exit %d), want nobody (%d:%d) in %s", s.stdout.String(), end.GetExitCode(), uid, gid, work)
	}
	s = start(t, t.Context(), h.json(), asUser(shellReq(`id -u`), "root"))
	if s.wait(t); strings.TrimSpace(s.stdout.String()) != "0" {
		t.Errorf("a command naming root ran as uid %q", s.stdout.String())
	}

	e := newFSEnv(t, withDefault)
	openTo(t, e.dir, 0o777)
	secret := filepath.Join(e.dir, "secret")
	writeMode(t, secret, "root only", 0o600)
	resp, b := e.do(t, restCall{method: "GET", path: "/files", query: url.Values{"path": {secret}}})
	wantStatus(t, "the default user reads root's 0600 file", resp, b, 403, "permission denied")
	resp, b = e.do(t, restCall{method: "GET", path: "/files", query: url.Values{"path": {secret}, "username": {"root"}}})
	wantStatus(t, "root reads root's 0600 file", resp, b, 200, "")
	p := filepath.Join(e.dir, "new.txt")
	resp, b = e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"path": {p}},
		header: hdr("X-Access-Token", testToken, "Content-Type", "application/octet-stream"), body: strings.NewReader("x")})
	wantStatus(t, "an upload naming no user", resp, b, 200, "")
	if got := ownerOf(t, p); got != [2]int{uid, gid} {
		t.Errorf("an upload naming no user made a file of %d:%d, want nobody's %d:%d", got[0], got[1], uid, gid)
	}
}

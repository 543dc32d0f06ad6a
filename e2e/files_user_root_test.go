//go:build root

package e2e

import (
	"context"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/runtime/runtimetest"
)

// TestRootFilesAsUser: envd's file calls as E2B's base template's user
// (`user`, uid 1000, in the Debian image's layer) through the real path —
// the daemon as PID 1 of a sandbox the node runtime binds — under runc and
// under gVisor alike: what the user writes is the user's, what it may not
// read or write is refused by the kernel (403, permission denied), its
// groups count, and a directory only root may make is made for it.
func TestRootFilesAsUser(t *testing.T) {
	s := framework.Get(t)
	needRunsc(t, s)
	rt := newContainerdRuntime(t, s, 2, 2, func(c *noderuntime.Config) {
		c.RuncPath, c.RunscPath = s.RuncBin, s.RunscBin
	})
	framework.Eventually(t, time.Minute, "two warm slots", func(ctx context.Context) (bool, error) {
		inv, err := rt.Inventory(ctx)
		return err == nil && inv.Count()[runtime.StateWarm] == 2, err
	})
	for _, tc := range []struct{ name, handler string }{
		{"runc", runtime.RuntimeHandlerRunc},
		{"gvisor", runtime.RuntimeHandlerRunsc},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := t.Context()
			uid := "fu-" + tc.name
			req := runtimetest.Request(uid, s.DebianImage)
			req.RuntimeHandler = tc.handler
			slot, err := rt.Bind(ctx, req)
			if err != nil {
				t.Fatalf("bind under %s: %v", tc.name, err)
			}
			t.Cleanup(func() { _ = rt.Release(context.WithoutCancel(ctx), uid, 0) })
			asRoot := func(script string) string {
				t.Helper()
				res, err := daemonClient(t, slot).Exec(ctx, api.ExecRequest{Cmd: []string{"sh", "-ec", script}})
				if err != nil || res.ExitCode != 0 {
					t.Fatalf("%s: %v %s", script, err, stdout(res))
				}
				return string(res.Stdout)
			}
			framework.Eventually(t, time.Minute, "the daemon", func(ctx context.Context) (bool, error) {
				out, err := sandboxExec(ctx, slot, runtimetest.Token, "id", "-u", "user")
				return err == nil && out == "1000\n", nil
			})
			kernel := asRoot("uname -r")
			if gv := strings.Contains(kernel, "gvisor"); gv != (tc.handler == runtime.RuntimeHandlerRunsc) {
				t.Fatalf("uname -r under %s: %q", tc.name, kernel)
			}
			asRoot(`groupadd -g 4242 team; usermod -aG team user
mkdir -p /srv/t/private; chmod 755 /srv/t; chmod 700 /srv/t/private
echo secret > /srv/t/root-only; chmod 600 /srv/t/root-only
echo team > /srv/t/team; chgrp team /srv/t/team; chmod 640 /srv/t/team
echo inner > /srv/t/private/inner
ln -s /srv/t/root-only /home/user/link`)

			e := envdClient{base: fmt.Sprintf("http://%s:%d", slot.IP, api.Port), user: "user"}
			// E2B's files.write, the call the issue saw refused.
			e.want(t, "POST", "/files", "/home/user/hello.txt", "hello", 200, "")
			if got := asRoot("stat -c %u:%g /home/user/hello.txt"); got != "1000:1000\n" {
				t.Errorf("the user's new file is owned by %q, want 1000:1000", got)
			}
			e.want(t, "GET", "/files", "/home/user/hello.txt", "", 200, "hello")
			e.want(t, "GET", "/files", "/srv/t/team", "", 200, "team") // a supplementary group's
			e.want(t, "POST", "/files", "/newtop/a.txt", "a", 200, "") // made for the user, as envd does
			if got := asRoot("stat -c %u:%g /newtop /newtop/a.txt"); got != "1000:1000\n1000:1000\n" {
				t.Errorf("a new top-level directory and its file are owned by %q, want the user's", got)
			}
			for _, c := range []struct{ method, path, body string }{
				{"GET", "/srv/t/root-only", ""},
				{"GET", "/home/user/link", ""}, // a link to root's file: the target is checked
				{"GET", "/etc/shadow", ""},
				{"GET", "/srv/t/private/inner", ""},
				{"POST", "/srv/t/root-only", "pwned"},
				{"POST", "/srv/t/new", "x"},
				{"POST", "/srv/t/private/new", "x"},
				{"POST", "/etc/passwd", "pwned"},
			} {
				e.want(t, c.method, "/files", c.path, c.body, 403, "permission denied")
			}
			// Connect's filesystem service, with the user in Basic auth as
			// E2B's SDK sends it.
			e.want(t, "POST", "/filesystem.Filesystem/ListDir", "/srv/t/private", "", 403, "permission denied")
			e.want(t, "POST", "/filesystem.Filesystem/MakeDir", "/srv/t/private/d", "", 403, "permission denied")
			e.want(t, "POST", "/filesystem.Filesystem/MakeDir", "/home/user/d", "", 200, "")
			if got := asRoot("cat /srv/t/root-only /etc/passwd | head -1; stat -c %u:%g /home/user/d; ls /srv/t; ls /srv/t/private"); got != "secret\n1000:1000\nprivate\nroot-only\nteam\ninner\n" {
				t.Errorf("after the user's calls: %q", got)
			}
		})
	}
}

// envdClient calls envd's REST and Connect paths of one sandbox as user.
type envdClient struct {
	base, user string
}

// want makes one call on path p and checks its status and that its body
// holds text: REST's /files take the path in the query and the body as
// the file, Connect's take {"path": p}.
func (e envdClient) want(t *testing.T, method, route, p, body string, status int, text string) {
	t.Helper()
	var req *http.Request
	var err error
	if route == "/files" {
		q := url.Values{"path": {p}, "username": {e.user}}
		req, err = http.NewRequestWithContext(t.Context(), method, e.base+route+"?"+q.Encode(), strings.NewReader(body))
		req.Header.Set("Content-Type", "application/octet-stream")
	} else {
		req, err = http.NewRequestWithContext(t.Context(), method, e.base+route, strings.NewReader(fmt.Sprintf(`{"path":%q}`, p)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(e.user+":")))
	}
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Access-Token", runtimetest.Token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s %s: %v", method, route, p, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status || !strings.Contains(string(b), text) {
		t.Errorf("%s %s %s as %s: %d %q, want %d with %q", method, route, p, e.user, resp.StatusCode, b, status, text)
	}
}

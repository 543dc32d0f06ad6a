package gateway

import (
	"crypto/sha256"
	"encoding/base64"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
)

// sdkSignature signs as the SDK's getSignature does: "v1_" and the
// base64 of SHA-256 over path:operation:user:token[:expiration], its
// padding cut.
func sdkSignature(path, op, user, token string, exp int64) string {
	raw := path + ":" + op + ":" + user + ":" + token
	if exp != 0 {
		raw += ":" + strconv.FormatInt(exp, 10)
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
}

// signedURL is what uploadUrl/downloadUrl return in single-endpoint mode.
func (e *env) signedURL(path, user, sig string, exp int64) string {
	q := url.Values{}
	if user != "" {
		q.Set("username", user)
	}
	if path != "" {
		q.Set("path", path)
	}
	q.Set("signature", sig)
	if exp != 0 {
		q.Set("signature_expiration", strconv.FormatInt(exp, 10))
	}
	return e.srv.URL + "/files?" + q.Encode()
}

// Signed file URLs: the gateway checks the signature with the token it
// derives and forwards with that token; an expired signature, another
// sandbox's, another path's, user's or operation's is refused (401) and
// reaches no daemon.
func TestSignedFileURLs(t *testing.T) {
	e := newEnv(t, func(c *Config) { c.SandboxDomain = "sandbox.test" })
	d := &recordingDaemon{}
	e.setDaemon(d)
	sb, _ := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base"})
	other, _ := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base"})
	tok := sb.EnvdAccessToken
	later, earlier := testNow.Unix()+60, testNow.Unix()-1
	do := func(method, u, host string) (int, string) {
		t.Helper()
		req, err := http.NewRequest(method, u, strings.NewReader("data"))
		if err != nil {
			t.Fatal(err)
		}
		if host != "" {
			req.Host = host
		} else {
			req.Header.Set("E2b-Sandbox-Id", sb.SandboxID)
		}
		resp, err := e.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	for _, tc := range []struct {
		name, method, url, host string
	}{
		{"download", http.MethodGet, e.signedURL("/home/user/a.txt", "user", sdkSignature("/home/user/a.txt", "read", "user", tok, 0), 0), ""},
		{"upload, expiring later", http.MethodPost, e.signedURL("/tmp/b", "", sdkSignature("/tmp/b", "write", "", tok, later), later), ""},
		{"upload without a path", http.MethodPost, e.signedURL("", "root", sdkSignature("", "write", "root", tok, 0), 0), ""},
		{"by host name", http.MethodGet, e.signedURL("/x", "", sdkSignature("/x", "read", "", tok, 0), 0), "49983-" + sb.SandboxID + ".sandbox.test"},
	} {
		d.take()
		if code, body := do(tc.method, tc.url, tc.host); code != http.StatusNoContent {
			t.Errorf("%s: %d %s", tc.name, code, body)
		}
		if got := d.take(); len(got) != 1 || got[0].token != tok {
			t.Errorf("%s: the daemon saw %+v, want one request with the sandbox's token", tc.name, got)
		}
	}
	for _, tc := range []struct {
		name, method, url, want string
	}{
		{"expired", http.MethodPost, e.signedURL("/tmp/b", "", sdkSignature("/tmp/b", "write", "", tok, earlier), earlier), "expired"},
		{"another sandbox's", http.MethodGet, e.signedURL("/x", "", sdkSignature("/x", "read", "", other.EnvdAccessToken, 0), 0), "not this sandbox's"},
		{"another path's", http.MethodGet, e.signedURL("/etc/shadow", "", sdkSignature("/x", "read", "", tok, 0), 0), "not this sandbox's"},
		{"another user's", http.MethodGet, e.signedURL("/x", "root", sdkSignature("/x", "read", "user", tok, 0), 0), "not this sandbox's"},
		{"a download's, to upload", http.MethodPost, e.signedURL("/x", "", sdkSignature("/x", "read", "", tok, 0), 0), "not this sandbox's"},
		{"its expiry moved", http.MethodPost, e.signedURL("/tmp/b", "", sdkSignature("/tmp/b", "write", "", tok, earlier), later), "not this sandbox's"},
		{"its expiry dropped", http.MethodPost, e.signedURL("/tmp/b", "", sdkSignature("/tmp/b", "write", "", tok, later), 0), "not this sandbox's"},
		{"another method", http.MethodDelete, e.signedURL("/x", "", sdkSignature("/x", "read", "", tok, 0), 0), "GET (download) or POST"},
		{"not E2B's form", http.MethodGet, e.signedURL("/x", "", "abc", 0), "v1 form"},
	} {
		d.take()
		code, body := do(tc.method, tc.url, "")
		if code != http.StatusUnauthorized || !strings.Contains(body, tc.want) {
			t.Errorf("%s: %d %s, want 401 saying %q", tc.name, code, body, tc.want)
		}
		if got := d.take(); len(got) != 0 {
			t.Errorf("%s: reached the daemon: %+v", tc.name, got)
		}
	}
}

package daemon_test

import (
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"connectrpc.com/connect"

	"github.com/sandman-dev/sandman/daemon"
	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/envd/spec/filesystem"
)

// restCall is one request to the envd REST paths.
type restCall struct {
	method, path string
	query        url.Values
	header       http.Header
	body         io.Reader
	// noLength sends the body chunked, with no Content-Length.
	noLength bool
}

// do sends c with the access token (unless c.header sets its own) and
// returns the answer with its body read. Compression is left to the test.
func (e *fsEnv) do(t *testing.T, c restCall) (*http.Response, []byte) {
	t.Helper()
	u := e.url + c.path
	if len(c.query) > 0 {
		u += "?" + c.query.Encode()
	}
	body := c.body
	if c.noLength && body != nil {
		body = io.MultiReader(body) // hides the length from net/http
	}
	req, err := http.NewRequestWithContext(t.Context(), c.method, u, body)
	if err != nil {
		t.Fatal(err)
	}
	if c.header == nil {
		req.Header.Set("X-Access-Token", testToken)
	}
	for k, v := range c.header {
		req.Header[k] = v
	}
	resp, err := (&http.Transport{DisableCompression: true}).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, b
}

// envdError decodes envd's REST error body.
func envdError(t *testing.T, b []byte) (int, string) {
	t.Helper()
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if err := json.Unmarshal(b, &e); err != nil {
		t.Fatalf("error body %q: %v", b, err)
	}
	return e.Code, e.Message
}

func wantStatus(t *testing.T, what string, resp *http.Response, b []byte, status int, msgHas string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("%s: status %d (%s), want %d", what, resp.StatusCode, b, status)
	}
	if status >= 400 {
		code, msg := envdError(t, b)
		if code != status {
			t.Errorf("%s: error code %d, want %d", what, code, status)
		}
		if !strings.Contains(msg, msgHas) {
			t.Errorf("%s: message %q does not say %q", what, msg, msgHas)
		}
	}
}

type writeInfo struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

func written(t *testing.T, b []byte) []writeInfo {
	t.Helper()
	var out []writeInfo
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("upload answer %q: %v", b, err)
	}
	return out
}

// multipartBody builds a form as the SDKs' FormData does: "file" parts
// whose file names carry the destination paths.
func multipartBody(t *testing.T, files ...[2]string) (io.Reader, string) {
	t.Helper()
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, f := range files {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", `form-data; name="file"; filename="`+f[0]+`"`)
		h.Set("Content-Type", "application/octet-stream")
		pw, err := mw.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = pw.Write([]byte(f[1]))
	}
	if err := mw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf, mw.FormDataContentType()
}

func hdr(kv ...string) http.Header {
	h := http.Header{"X-Access-Token": {testToken}}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

func TestEnvdRESTHealth(t *testing.T) {
	e := newFSEnv(t)
	resp, b := e.do(t, restCall{method: "GET", path: "/health", header: http.Header{}})
	if resp.StatusCode != http.StatusNoContent || len(b) != 0 {
		t.Fatalf("GET /health without a token: %d %q, want 204", resp.StatusCode, b)
	}
	// Another method falls to the daemon's catch-all, as POST /v1/health does.
	resp, _ = e.do(t, restCall{method: "POST", path: "/health"})
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("POST /health: %d, want 404", resp.StatusCode)
	}
	// The v1 paths beside it are untouched.
	resp, b = e.do(t, restCall{method: "GET", path: "/v1/health", header: http.Header{}})
	var h api.Health
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &h) != nil || h.Status != "ok" {
		t.Errorf("GET /v1/health: %d %q", resp.StatusCode, b)
	}
	if resp, _ := e.do(t, restCall{method: "GET", path: "/healthz"}); resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /healthz: %d, want 404", resp.StatusCode)
	}
}

// TestEnvdRESTUnassigned: a hot slot waiting for its pod answers health,
// and 503 to the rest.
func TestEnvdRESTUnassigned(t *testing.T) {
	assign := sha256.Sum256([]byte("assign-token"))
	e := newFSEnv(t, func(c *daemon.Config) { c.AssignTokenHash = &assign })
	resp, _ := e.do(t, restCall{method: "GET", path: "/health", header: http.Header{}})
	if resp.StatusCode != http.StatusNoContent {
		t.Errorf("GET /health: %d, want 204", resp.StatusCode)
	}
	resp, b := e.do(t, restCall{method: "GET", path: "/files", query: url.Values{"path": {"/etc/hostname"}}})
	wantStatus(t, "GET /files", resp, b, http.StatusServiceUnavailable, "not assigned")
	_, err := e.fs(testToken, "").Stat(t.Context(), connect.NewRequest(&filesystem.StatRequest{Path: "/"}))
	wantFSCode(t, "Stat", err, connect.CodeUnavailable)
}

func TestEnvdRESTFilesRoundTrip(t *testing.T) {
	e := newFSEnv(t)
	data := make([]byte, 5<<20)
	_, _ = rand.Read(data)

	// application/octet-stream to a relative path: parents made.
	resp, b := e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"path": {"up/a/b.bin"}},
		header: hdr("Content-Type", "application/octet-stream"), body: bytes.NewReader(data)})
	wantStatus(t, "upload", resp, b, http.StatusOK, "")
	p := filepath.Join(e.dir, "up/a/b.bin")
	if got := written(t, b); len(got) != 1 || got[0] != (writeInfo{Name: "b.bin", Type: "file", Path: p}) {
		t.Errorf("upload answered %+v", got)
	}
	if disk, err := os.ReadFile(p); err != nil || !bytes.Equal(disk, data) {
		t.Fatalf("uploaded file differs (%v)", err)
	}

	resp, b = e.do(t, restCall{method: "GET", path: "/files", query: url.Values{"path": {"up/a/b.bin"}}})
	wantStatus(t, "download", resp, b, http.StatusOK, "")
	if !bytes.Equal(b, data) {
		t.Fatalf("downloaded %d bytes, not the %d uploaded", len(b), len(data))
	}
	if ct, cd, cl := resp.Header.Get("Content-Type"), resp.Header.Get("Content-Disposition"), resp.Header.Get("Content-Length"); ct != "application/octet-stream" ||
		cd != `attachment; filename=b.bin` || cl != strconv.Itoa(len(data)) {
		t.Errorf("download headers: Content-Type %q, Content-Disposition %q, Content-Length %q", ct, cd, cl)
	}
	// A range, served on the bytes.
	resp, b = e.do(t, restCall{method: "GET", path: "/files", query: url.Values{"path": {p}}, header: hdr("Range", "bytes=10-19", "Accept-Encoding", "gzip")})
	if resp.StatusCode != http.StatusPartialContent || !bytes.Equal(b, data[10:20]) || resp.Header.Get("Content-Encoding") != "" {
		t.Errorf("range: %d, %d bytes, encoding %q", resp.StatusCode, len(b), resp.Header.Get("Content-Encoding"))
	}
	// gzip, when asked for.
	resp, b = e.do(t, restCall{method: "GET", path: "/files", query: url.Values{"path": {p}}, header: hdr("Accept-Encoding", "gzip")})
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("gzip download: %d, encoding %q", resp.StatusCode, resp.Header.Get("Content-Encoding"))
	}
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if plain, err := io.ReadAll(zr); err != nil || !bytes.Equal(plain, data) {
		t.Fatalf("gunzipped download differs (%v)", err)
	}
	// A gzip-compressed upload.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte("compressed hello"))
	_ = zw.Close()
	resp, b = e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"path": {"gz.txt"}},
		header: hdr("Content-Type", "application/octet-stream", "Content-Encoding", "gzip"), body: &gz, noLength: true})
	wantStatus(t, "gzip upload", resp, b, http.StatusOK, "")
	if disk, _ := os.ReadFile(filepath.Join(e.dir, "gz.txt")); string(disk) != "compressed hello" {
		t.Errorf("gzip upload wrote %q", disk)
	}

	// Multipart, several files, each named by its part's file name.
	abs := filepath.Join(e.home, "abs.txt")
	body, ctype := multipartBody(t, [2]string{"m/one.txt", "one"}, [2]string{abs, "two"})
	resp, b = e.do(t, restCall{method: "POST", path: "/files", header: hdr("Content-Type", ctype), body: body})
	wantStatus(t, "multipart upload", resp, b, http.StatusOK, "")
	want := []writeInfo{{"one.txt", "file", filepath.Join(e.dir, "m/one.txt")}, {"abs.txt", "file", abs}}
	if got := written(t, b); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("multipart answered %+v, want %+v", got, want)
	}
	for p, c := range map[string]string{filepath.Join(e.dir, "m/one.txt"): "one", abs: "two"} {
		if disk, _ := os.ReadFile(p); string(disk) != c {
			t.Errorf("%s holds %q, want %q", p, disk, c)
		}
	}
	// Multipart with the path parameter: it names the destination.
	body, ctype = multipartBody(t, [2]string{"ignored.txt", "by path"})
	resp, b = e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"path": {"~/by-path.txt"}}, header: hdr("Content-Type", ctype), body: body})
	wantStatus(t, "multipart with path", resp, b, http.StatusOK, "")
	if disk, _ := os.ReadFile(filepath.Join(e.home, "by-path.txt")); string(disk) != "by path" {
		t.Errorf("by-path.txt holds %q", disk)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "ignored.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the part's name was used despite the path parameter: %v", err)
	}

	// Through links, as a shell's > goes: a link to a file is written
	// through, a linked directory is written into.
	writeTestFile(t, filepath.Join(e.home, "target.txt"), "old")
	if err := os.Symlink(filepath.Join(e.home, "target.txt"), filepath.Join(e.dir, "tlink")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(e.home, filepath.Join(e.dir, "hlink")); err != nil {
		t.Fatal(err)
	}
	for _, up := range [][2]string{{"tlink", "through"}, {"hlink/in.txt", "into"}, {"m/../dotdot.txt", "dots"}} {
		resp, b = e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"path": {up[0]}},
			header: hdr("Content-Type", "application/octet-stream"), body: strings.NewReader(up[1])})
		wantStatus(t, "upload to "+up[0], resp, b, http.StatusOK, "")
	}
	for p, c := range map[string]string{filepath.Join(e.home, "target.txt"): "through", filepath.Join(e.home, "in.txt"): "into", filepath.Join(e.dir, "dotdot.txt"): "dots"} {
		if disk, _ := os.ReadFile(p); string(disk) != c {
			t.Errorf("%s holds %q, want %q", p, disk, c)
		}
	}
	if fi, err := os.Lstat(filepath.Join(e.dir, "tlink")); err != nil || fi.Mode()&os.ModeSymlink == 0 {
		t.Errorf("the link was replaced: %v", err)
	}

	// Overwriting writes in place (a watch sees the file written), and an
	// empty file downloads as empty.
	before, _ := os.Stat(p)
	resp, b = e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"path": {p}},
		header: hdr("Content-Type", "application/octet-stream"), body: strings.NewReader("")})
	wantStatus(t, "overwrite", resp, b, http.StatusOK, "")
	after, _ := os.Stat(p)
	if !os.SameFile(before, after) || after.Size() != 0 {
		t.Errorf("overwrite: same file %v, size %d", os.SameFile(before, after), after.Size())
	}
	resp, b = e.do(t, restCall{method: "GET", path: "/files", query: url.Values{"path": {p}}})
	if resp.StatusCode != http.StatusOK || len(b) != 0 || resp.Header.Get("Content-Length") != "0" {
		t.Errorf("empty download: %d, %d bytes, Content-Length %q", resp.StatusCode, len(b), resp.Header.Get("Content-Length"))
	}
}

// TestEnvdRESTUploadWatched: an upload over a file is seen as a write by a
// watch, as the SDKs' watch tests expect.
func TestEnvdRESTUploadWatched(t *testing.T) {
	e := newFSEnv(t)
	writeTestFile(t, filepath.Join(e.dir, "w/f.txt"), "old")
	w, err := startWatch(t, e.fs(testToken, "", connect.WithProtoJSON()), connect.NewRequest(&filesystem.WatchDirRequest{Path: "w"}))
	if err != nil {
		t.Fatal(err)
	}
	resp, b := e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"path": {"w/f.txt"}},
		header: hdr("Content-Type", "application/octet-stream"), body: strings.NewReader("new")})
	wantStatus(t, "upload", resp, b, http.StatusOK, "")
	w.waitFor(t, filesystem.EventType_EVENT_TYPE_WRITE, "f.txt")
}

func TestEnvdRESTFilesErrors(t *testing.T) {
	e := newFSEnv(t, func(c *daemon.Config) { c.MaxUploadBytes = 1 << 20 })
	writeTestFile(t, filepath.Join(e.dir, "file"), "x")
	octet := func(kv ...string) http.Header {
		return hdr(append([]string{"Content-Type", "application/octet-stream"}, kv...)...)
	}
	for _, tc := range []struct {
		name   string
		call   restCall
		status int
		msg    string
	}{
		{"download missing", restCall{method: "GET", path: "/files", query: url.Values{"path": {"nope"}}}, 404, filepath.Join(e.dir, "nope")},
		{"download a directory", restCall{method: "GET", path: "/files", query: url.Values{"path": {"/"}}}, 400, "is a directory"},
		{"download without acceptable coding", restCall{method: "GET", path: "/files", query: url.Values{"path": {"file"}}, header: hdr("Accept-Encoding", "br, identity;q=0")}, 406, "gzip"},
		{"download as an unknown user", restCall{method: "GET", path: "/files", query: url.Values{"path": {"file"}, "username": {"no-such-user-xyz"}}}, 401, "no-such-user-xyz"},
		{"download without a token", restCall{method: "GET", path: "/files", query: url.Values{"path": {"file"}}, header: http.Header{}}, 401, "X-Access-Token"},
		{"download with a wrong token", restCall{method: "GET", path: "/files", query: url.Values{"path": {"file"}}, header: http.Header{"X-Access-Token": {"wrong"}}}, 401, "X-Access-Token"},
		{"download by a signed URL", restCall{method: "GET", path: "/files", query: url.Values{"path": {"file"}, "signature": {"v1_abc"}, "signature_expiration": {"99999999999"}}, header: http.Header{}}, 401, "signed"},
		{"upload without a path", restCall{method: "POST", path: "/files", header: octet(), body: strings.NewReader("x")}, 400, "path parameter is required"},
		{"upload onto a directory", restCall{method: "POST", path: "/files", query: url.Values{"path": {e.dir}}, header: octet(), body: strings.NewReader("x")}, 400, "is a directory"},
		{"upload under a file", restCall{method: "POST", path: "/files", query: url.Values{"path": {"file/x"}}, header: octet(), body: strings.NewReader("x")}, 400, "not a directory"},
		{"upload of another type", restCall{method: "POST", path: "/files", query: url.Values{"path": {"t"}}, header: hdr("Content-Type", "text/plain"), body: strings.NewReader("x")}, 400, "multipart/form-data or application/octet-stream"},
		{"upload with invalid metadata", restCall{method: "POST", path: "/files", query: url.Values{"path": {"t"}}, header: octet("X-Metadata-Owner", "m\u00e9"), body: strings.NewReader("x")}, 400, "metadata"},
		{"upload with another coding", restCall{method: "POST", path: "/files", query: url.Values{"path": {"t"}}, header: octet("Content-Encoding", "br"), body: strings.NewReader("x")}, 400, "Content-Encoding"},
		{"upload of a big body", restCall{method: "POST", path: "/files", query: url.Values{"path": {"big"}}, header: octet(), body: bytes.NewReader(make([]byte, 2<<20))}, 413, "limit of 1048576 bytes"},
		{"upload of a big chunked body", restCall{method: "POST", path: "/files", query: url.Values{"path": {"big"}}, header: octet(), body: bytes.NewReader(make([]byte, 2<<20)), noLength: true}, 413, "limit of 1048576 bytes"},
		{"upload by a signed URL", restCall{method: "POST", path: "/files", query: url.Values{"path": {"t"}, "signature": {"v1_abc"}}, header: http.Header{"Content-Type": {"application/octet-stream"}}, body: strings.NewReader("x")}, 401, "hash of the access token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, b := e.do(t, tc.call)
			wantStatus(t, tc.name, resp, b, tc.status, tc.msg)
		})
	}
	if _, err := os.Stat(filepath.Join(e.dir, "big")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused upload left a file: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.dir, "t")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused upload left a file: %v", err)
	}
	// A gzip body that expands past the limit.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(make([]byte, 3<<20))
	_ = zw.Close()
	resp, b := e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"path": {"bomb/x"}}, header: octet("Content-Encoding", "gzip"), body: &gz})
	wantStatus(t, "gzip over the limit", resp, b, 413, "limit")
	if _, err := os.Stat(filepath.Join(e.dir, "bomb")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a refused upload left its directory: %v", err)
	}
	// A signed URL that carries the token too is served by the token.
	resp, b = e.do(t, restCall{method: "GET", path: "/files", query: url.Values{"path": {"file"}, "signature": {"v1_abc"}}})
	if resp.StatusCode != http.StatusOK || string(b) != "x" {
		t.Errorf("signed URL with the token: %d %q", resp.StatusCode, b)
	}
	// Two files for one path parameter: the first is written, the rest refused.
	body, ctype := multipartBody(t, [2]string{"a", "1"}, [2]string{"b", "2"})
	resp, b = e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"path": {"one"}}, header: hdr("Content-Type", ctype), body: body})
	wantStatus(t, "two files to one path", resp, b, 400, "two files")
	// A body that breaks off is the client's error, and leaves no file.
	full, fctype := multipartBody(t, [2]string{"cut.txt", strings.Repeat("x", 4096)})
	cut, _ := io.ReadAll(full)
	resp, b = e.do(t, restCall{method: "POST", path: "/files", header: hdr("Content-Type", fctype), body: bytes.NewReader(cut[:len(cut)/2])})
	wantStatus(t, "cut multipart body", resp, b, 400, "could not be read")
	gz.Reset()
	zw = gzip.NewWriter(&gz)
	_, _ = zw.Write(bytes.Repeat([]byte("y"), 100000))
	_ = zw.Close()
	resp, b = e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"path": {"cut.gz.txt"}}, header: octet("Content-Encoding", "gzip"), body: bytes.NewReader(gz.Bytes()[:gz.Len()/2])})
	wantStatus(t, "cut gzip body", resp, b, 400, "could not be read")
	for _, p := range []string{"cut.txt", "cut.gz.txt"} {
		if _, err := os.Stat(filepath.Join(e.dir, p)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a broken upload left %s: %v", p, err)
		}
	}
	// A multipart part without a name, and no path.
	body, ctype = multipartBody(t, [2]string{"", "x"})
	resp, b = e.do(t, restCall{method: "POST", path: "/files", header: hdr("Content-Type", ctype), body: body})
	wantStatus(t, "nameless part", resp, b, 400, "no file name")
}

// TestEnvdRESTFilesOwner: an upload for a user makes what it creates
// theirs; a file that was there, and that they may write, keeps its owner.
func TestEnvdRESTFilesOwner(t *testing.T) {
	uid, gid := rootAndNobody(t)
	e := newFSEnv(t)
	openTo(t, e.dir, 0o777)
	writeMode(t, filepath.Join(e.dir, "mine"), "root's", 0o666)
	for _, p := range []string{filepath.Join(e.dir, "n/a/new.txt"), filepath.Join(e.dir, "mine")} {
		resp, b := e.do(t, restCall{method: "POST", path: "/files", query: url.Values{"path": {p}, "username": {"nobody"}},
			header: hdr("Content-Type", "application/octet-stream"), body: strings.NewReader("x")})
		wantStatus(t, "upload as nobody", resp, b, http.StatusOK, "")
	}
	// The Basic user counts when there is no username parameter.
	body, ctype := multipartBody(t, [2]string{filepath.Join(e.dir, "n/basic.txt"), "x"})
	resp, b := e.do(t, restCall{method: "POST", path: "/files",
		header: hdr("Content-Type", ctype, "Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("nobody:"))), body: body})
	wantStatus(t, "multipart as nobody", resp, b, http.StatusOK, "")
	for p, want := range map[string][2]int{"n": {uid, gid}, "n/a": {uid, gid}, "n/a/new.txt": {uid, gid}, "n/basic.txt": {uid, gid}, "mine": {0, 0}} {
		fi, err := os.Lstat(filepath.Join(e.dir, p))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != want[0] || int(st.Gid) != want[1] {
			t.Errorf("%s owned by %d:%d, want %d:%d", p, st.Uid, st.Gid, want[0], want[1])
		}
	}
}

func TestEnvdRESTEnvsAndInit(t *testing.T) {
	e := newFSEnv(t)
	envs := func() map[string]string {
		resp, b := e.do(t, restCall{method: "GET", path: "/envs"})
		wantStatus(t, "GET /envs", resp, b, http.StatusOK, "")
		var m map[string]string
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	if m := envs(); m["HOME"] != e.home || m["PATH"] != "/usr/bin:/bin" {
		t.Errorf("GET /envs = %v", m)
	}
	for _, p := range []string{"/envs", "/metrics"} {
		resp, b := e.do(t, restCall{method: "GET", path: p, header: http.Header{}})
		wantStatus(t, "GET "+p+" without a token", resp, b, 401, "X-Access-Token")
	}
	resp, b := e.do(t, restCall{method: "POST", path: "/init", header: http.Header{}, body: strings.NewReader(`{"envVars":{"EVIL":"1"}}`)})
	wantStatus(t, "POST /init without a token", resp, b, 401, "X-Access-Token")

	newDir := t.TempDir()
	resp, b = e.do(t, restCall{method: "POST", path: "/init", header: hdr("Content-Type", "application/json"),
		body: strings.NewReader(`{"envVars":{"FOO":"bar"},"accessToken":"` + testToken + `","timestamp":"2026-01-02T03:04:05Z","defaultWorkdir":"` + newDir + `"}`)})
	wantStatus(t, "POST /init", resp, b, http.StatusNoContent, "")
	if m := envs(); m["FOO"] != "bar" || m["HOME"] != e.home || m["EVIL"] != "" {
		t.Errorf("after /init, GET /envs = %v", m)
	}
	res, err := e.harness.client.Exec(t.Context(), api.ExecRequest{Shell: `echo "$FOO $(pwd)"`})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(res.Stdout)); got != "bar "+newDir {
		t.Errorf("a command after /init sees %q, want %q", got, "bar "+newDir)
	}
	st, err := e.fs(testToken, "", connect.WithProtoJSON()).Stat(t.Context(), connect.NewRequest(&filesystem.StatRequest{Path: ""}))
	if err != nil || st.Msg.GetEntry().GetPath() != newDir {
		t.Errorf("relative paths after /init start at %v (%v), want %s", st.Msg.GetEntry().GetPath(), err, newDir)
	}
	for _, tc := range []struct{ name, body, msg string }{
		{"another token", `{"accessToken":"other"}`, "cannot be changed"},
		{"a default user", `{"envVars":{"NOPE":"1"},"defaultUser":"user"}`, "defaultUser"},
		{"volume mounts", `{"volumeMounts":[{"nfs_target":"x","path":"/mnt"}]}`, "volumeMounts"},
		{"a relative workdir", `{"defaultWorkdir":"rel"}`, "absolute"},
		{"a bad name", `{"envVars":{"A=B":"1"}}`, "not valid"},
		{"malformed JSON", `{"envVars":`, "malformed"},
	} {
		resp, b := e.do(t, restCall{method: "POST", path: "/init", body: strings.NewReader(tc.body)})
		status := http.StatusBadRequest
		if tc.name == "another token" {
			status = http.StatusConflict
		}
		wantStatus(t, "POST /init with "+tc.name, resp, b, status, tc.msg)
	}
	if m := envs(); m["NOPE"] != "" {
		t.Errorf("a refused /init changed the environment: %v", m)
	}
	// An empty /init is fine; the token still works, another does not.
	resp, b = e.do(t, restCall{method: "POST", path: "/init"})
	wantStatus(t, "empty POST /init", resp, b, http.StatusNoContent, "")
	resp, b = e.do(t, restCall{method: "GET", path: "/envs", header: http.Header{"X-Access-Token": {"other"}}})
	wantStatus(t, "GET /envs with another token", resp, b, 401, "")
}

func TestEnvdRESTMetrics(t *testing.T) {
	e := newFSEnv(t)
	for i := range 2 { // the first measures over a window, the second since the first
		resp, b := e.do(t, restCall{method: "GET", path: "/metrics"})
		wantStatus(t, "GET /metrics", resp, b, http.StatusOK, "")
		var m struct {
			Ts          *int64   `json:"ts"`
			CPUCount    *int     `json:"cpu_count"`
			CPUUsedPct  *float64 `json:"cpu_used_pct"`
			MemTotal    *uint64  `json:"mem_total"`
			MemUsed     *uint64  `json:"mem_used"`
			MemCache    *uint64  `json:"mem_cache"`
			MemTotalMiB *uint64  `json:"mem_total_mib"`
			MemUsedMiB  *uint64  `json:"mem_used_mib"`
			DiskTotal   *uint64  `json:"disk_total"`
			DiskUsed    *uint64  `json:"disk_used"`
		}
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		if m.Ts == nil || m.CPUCount == nil || m.CPUUsedPct == nil || m.MemTotal == nil || m.MemUsed == nil || m.MemCache == nil ||
			m.MemTotalMiB == nil || m.MemUsedMiB == nil || m.DiskTotal == nil || m.DiskUsed == nil {
			t.Fatalf("call %d: a field is missing: %s", i, b)
		}
		if *m.Ts != e.clock.Now().Unix() || *m.CPUCount < 1 || *m.CPUUsedPct < 0 || *m.CPUUsedPct > 100 ||
			*m.MemTotal == 0 || *m.MemUsed > *m.MemTotal || *m.MemTotalMiB != *m.MemTotal>>20 ||
			*m.DiskTotal == 0 || *m.DiskUsed > *m.DiskTotal {
			t.Errorf("call %d: implausible metrics %s", i, b)
		}
	}
}

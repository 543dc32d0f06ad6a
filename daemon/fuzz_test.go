package daemon

import (
	"archive/tar"
	"bytes"
	"errors"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandman-dev/sandman/daemon/api"
)

// FuzzDecodeExecRequest: any body decodes to a request or a clear API error,
// never a panic or an unclassified error.
func FuzzDecodeExecRequest(f *testing.F) {
	for _, seed := range []string{
		`{"cmd":["echo","hi"]}`, `{"shell":"ls -la","env":{"A":"b"},"cwd":"/tmp","timeout_seconds":1.5}`,
		`{"cmd":["cat"],"stdin":"aGVsbG8="}`, `{"cmd":`, ``, `null`, `[]`, `{"cmd":"x"}`, `{"unknown":1}`,
		`{"max_output_bytes":-1}`, `{"cmd":["a"]}{"cmd":["b"]}`, "\x00\xff",
	} {
		f.Add([]byte(seed))
	}
	s, err := New(Config{AllowUnauthenticated: true, MaxBodyBytes: 4096})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r := httptest.NewRequest("POST", "/v1/exec", bytes.NewReader(body))
		w := httptest.NewRecorder()
		var req api.ExecRequest
		err := s.decode(w, r, &req)
		if err == nil {
			return
		}
		var ae *apiError
		if !errors.As(err, &ae) || ae.code == "" || ae.msg == "" || ae.status < 400 {
			t.Fatalf("decode(%q) = %v: want an API error with code and message", body, err)
		}
	})
}

// FuzzCleanPath: accepted paths are absolute, clean and NUL-free.
func FuzzCleanPath(f *testing.F) {
	for _, seed := range []string{"/", "/tmp/x", "relative", "", "/a/../../b", "/a//b/./c/", "/\x00", "//x", "/a/b/.."} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got, err := cleanPath("path", p)
		if err != nil {
			return
		}
		if !strings.HasPrefix(got, "/") || path.Clean(got) != got || strings.ContainsRune(got, 0) {
			t.Fatalf("cleanPath(%q) = %q", p, got)
		}
	})
}

// FuzzExtractTarNames: whatever the entry names, extraction writes only
// inside the target directory.
func FuzzExtractTarNames(f *testing.F) {
	for _, seed := range []string{"a", "dir/b", "../x", "/abs", "a/../../y", "./c", "..", "a/./../b", "//d", "e/"} {
		f.Add(seed, "content")
	}
	f.Fuzz(func(t *testing.T, name, content string) {
		root := t.TempDir()
		target := filepath.Join(root, "target")
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		if tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(content))}) != nil {
			return
		}
		_, _ = tw.Write([]byte(content))
		_ = tw.Close()
		_, _ = extractTar(&buf, target)
		entries, err := os.ReadDir(root)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			if e.Name() != "target" {
				t.Fatalf("entry %q wrote %q outside the target", name, e.Name())
			}
		}
	})
}

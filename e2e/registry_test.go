//go:build root || e2e

package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/crane"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
)

// testImage is an image pushed by a test.
type testImage struct {
	Ref   string
	Blobs int   // layers + config
	Bytes int64 // compressed layers + config + manifest
}

// pushRandomImage pushes an image of `layers` layers, each one file of
// layerBytes random (incompressible) bytes, to the registry at host
// (plain HTTP), as repo:tag. user/pass, when set, authenticate the push.
func pushRandomImage(t testing.TB, host, repo, tag string, layers, layerBytes int, user, pass string) testImage {
	t.Helper()
	type desc struct {
		MediaType string `json:"mediaType"`
		Digest    string `json:"digest"`
		Size      int64  `json:"size"`
	}
	var (
		layerDescs []desc
		diffIDs    []string
		total      int64
	)
	push := func(b []byte) string {
		sum := sha256.Sum256(b)
		dgst := "sha256:" + hex.EncodeToString(sum[:])
		resp := registryDo(t, http.MethodPost, "http://"+host+"/v2/"+repo+"/blobs/uploads/", nil, "", user, pass)
		loc := resp.Header.Get("Location")
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			t.Fatalf("start blob upload to %s: %s", host, resp.Status)
		}
		u, err := url.Parse(loc)
		if err != nil {
			t.Fatal(err)
		}
		if !u.IsAbs() {
			u, _ = url.Parse("http://" + host + loc)
		}
		q := u.Query()
		q.Set("digest", dgst)
		u.RawQuery = q.Encode()
		resp = registryDo(t, http.MethodPut, u.String(), b, "application/octet-stream", user, pass)
		resp.Body.Close()
		if resp.StatusCode != http.StatusCreated {
			t.Fatalf("upload blob to %s: %s", host, resp.Status)
		}
		total += int64(len(b))
		return dgst
	}
	for i := range layers {
		data := make([]byte, layerBytes)
		_, _ = rand.Read(data)
		var tarBuf bytes.Buffer
		tw := tar.NewWriter(&tarBuf)
		_ = tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("data/%s-%d.bin", tag, i), Mode: 0o644, Size: int64(len(data)), ModTime: time.Unix(0, 0)})
		_, _ = tw.Write(data)
		_ = tw.Close()
		diff := sha256.Sum256(tarBuf.Bytes())
		diffIDs = append(diffIDs, "sha256:"+hex.EncodeToString(diff[:]))
		var gz bytes.Buffer
		zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
		_, _ = zw.Write(tarBuf.Bytes())
		_ = zw.Close()
		layerDescs = append(layerDescs, desc{"application/vnd.oci.image.layer.v1.tar+gzip", push(gz.Bytes()), int64(gz.Len())})
	}
	config, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Cmd": []string{"/bin/sh"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": diffIDs},
	})
	configDesc := desc{"application/vnd.oci.image.config.v1+json", push(config), int64(len(config))}
	manifest, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": configDesc, "layers": layerDescs,
	})
	resp := registryDo(t, http.MethodPut, "http://"+host+"/v2/"+repo+"/manifests/"+tag, manifest,
		"application/vnd.oci.image.manifest.v1+json", user, pass)
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("put manifest to %s: %s", host, resp.Status)
	}
	return testImage{Ref: host + "/" + repo + ":" + tag, Blobs: layers + 1, Bytes: total + int64(len(manifest))}
}

func registryDo(t testing.TB, method, u string, body []byte, contentType, user, pass string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(method, u, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	if user != "" {
		req.SetBasicAuth(user, pass)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// registryProxy sits in front of a registry: it counts blob downloads and
// can slow them down, so tests see how often and how fast a node pulls.
type registryProxy struct {
	Host     string
	blobGets atomic.Int64
	requests atomic.Int64
	// bytesPerSecond throttles blob downloads (0: full speed).
	bytesPerSecond atomic.Int64

	mu sync.Mutex
	// byDigest counts blob downloads per digest (sha256:…), guarded by mu.
	byDigest map[string]int
}

func startRegistryProxy(t testing.TB, target string) *registryProxy {
	t.Helper()
	p := &registryProxy{byDigest: map[string]int{}}
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: target})
	rp.ModifyResponse = func(resp *http.Response) error {
		if bps := p.bytesPerSecond.Load(); bps > 0 && strings.Contains(resp.Request.URL.Path, "/blobs/") {
			resp.Body = &slowReader{r: resp.Body, bps: bps}
		}
		return nil
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.requests.Add(1)
		if r.Method == http.MethodGet && strings.Contains(r.URL.Path, "/blobs/") {
			p.blobGets.Add(1)
			p.mu.Lock()
			p.byDigest[r.URL.Path[strings.LastIndex(r.URL.Path, "/")+1:]]++
			p.mu.Unlock()
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(func() { srv.CloseClientConnections(); srv.Close() })
	p.Host = strings.TrimPrefix(srv.URL, "http://")
	return p
}

func (p *registryProxy) BlobGets() int64 { return p.blobGets.Load() }

// BlobGetsByDigest is how often each blob was downloaded so far, by digest.
func (p *registryProxy) BlobGetsByDigest() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return maps.Clone(p.byDigest)
}

// Requests counts every request the registry was sent through the proxy.
func (p *registryProxy) Requests() int64 { return p.requests.Load() }

// slowReader reads at most bps bytes per second.
type slowReader struct {
	r     io.ReadCloser
	bps   int64
	start time.Time
	n     int64
}

func (s *slowReader) Read(b []byte) (int, error) {
	if s.start.IsZero() {
		s.start = time.Now()
	}
	if len(b) > 32<<10 {
		b = b[:32<<10]
	}
	n, err := s.r.Read(b)
	s.n += int64(n)
	if ahead := time.Duration(float64(s.n)/float64(s.bps)*float64(time.Second)) - time.Since(s.start); ahead > 0 {
		time.Sleep(ahead) // pacing a download, not waiting for a condition
	}
	return n, err
}

func (s *slowReader) Close() error { return s.r.Close() }

// startAuthRegistry starts a second registry, from the stack's registry
// binary, that wants user/pass (htpasswd, bcrypt). It returns its host.
func startAuthRegistry(t testing.TB, s *framework.Stack, user, pass string) string {
	t.Helper()
	return startTestRegistry(t, s, user, pass).Host
}

// testRegistry is a registry process of a test's own.
type testRegistry struct {
	Host string
	// Dir holds its storage (Dir/data) and configuration.
	Dir string
	// Stop kills it (the test's end does too).
	Stop func()
}

// startTestRegistry starts a registry of the test's own, from the stack's
// registry binary: one that wants user/pass (htpasswd, bcrypt), or anyone's
// when user is empty.
func startTestRegistry(t testing.TB, s *framework.Stack, user, pass string) testRegistry {
	t.Helper()
	bin := s.Env["REGISTRY_BIN"]
	if bin == "" {
		matches, _ := filepath.Glob("/var/cache/sandman/registry-*/registry")
		if len(matches) == 0 {
			t.Fatal("no registry binary: run hack/build-tools.sh")
		}
		bin = matches[0]
	}
	dir := t.TempDir()
	auth, ready := "", http.StatusOK
	if user != "" {
		hash, err := bcrypt.GenerateFromPassword([]byte(pass), bcrypt.MinCost)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "htpasswd"), []byte(user+":"+string(hash)+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		auth, ready = fmt.Sprintf("auth:\n  htpasswd:\n    realm: sandman-test\n    path: %s/htpasswd\n", dir), http.StatusUnauthorized
	}
	port := freePort(t)
	host := "127.0.0.1:" + strconv.Itoa(port)
	cfg := fmt.Sprintf(`version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: %s/data
%shttp:
  addr: %s
`, dir, auth, host)
	if err := os.WriteFile(filepath.Join(dir, "config.yml"), []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", filepath.Join(dir, "config.yml"))
	cmd.Env = append(os.Environ(), "OTEL_TRACES_EXPORTER=none")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		})
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("test registry output:\n%s", out.String())
		}
	})
	framework.Eventually(t, 30*time.Second, "the test registry to answer", func(ctx context.Context) (bool, error) {
		resp, err := http.Get("http://" + host + "/v2/")
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == ready, nil
	})
	return testRegistry{Host: host, Dir: dir, Stop: stop}
}

// dockerConfig is a kubernetes.io/dockerconfigjson secret's payload.
func dockerConfig(host, user, pass string) []byte {
	b, _ := json.Marshal(map[string]any{"auths": map[string]any{
		host: map[string]string{"auth": base64.StdEncoding.EncodeToString([]byte(user + ":" + pass))},
	}})
	return b
}

// statusOf is image's entry in a node's image list.
func statusOf(all []runtime.ImageStatus, image string) runtime.ImageStatus {
	for _, st := range all {
		if st.Image == image {
			return st
		}
	}
	return runtime.ImageStatus{}
}

// copyImage copies the image src (the stack's registry, no credentials)
// to dst in a registry that wants user/pass, and returns dst.
func copyImage(t testing.TB, src, dst, user, pass string) string {
	t.Helper()
	if err := crane.Copy(src, dst, crane.Insecure, crane.WithAuth(&authn.Basic{Username: user, Password: pass})); err != nil {
		t.Fatalf("copy %s to %s: %v", src, dst, err)
	}
	return dst
}

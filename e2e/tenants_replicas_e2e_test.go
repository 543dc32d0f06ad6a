//go:build e2e

package e2e

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/sandman-dev/sandman/e2e/framework"
)

// buildStatus is what a build's status call answers.
type buildStatus struct {
	Status string `json:"status"`
	Reason *struct {
		Message string `json:"message"`
	} `json:"reason"`
}

// buildsAcrossReplicas runs two gateway replicas as the deployed gateway
// runs them (one token key, the uploads in a registry both reach) and
// sends each call of a template build with a COPY step to the other
// replica than the one before: the build is requested on one, its files'
// upload URL asked of the other and uploaded to the first, the build
// started on the second and its status read on both. Then a replica
// stopped while it runs a build (a rolling update's SIGTERM) ends that
// build with a status saying so, read on the replica that stays.
func buildsAcrossReplicas(t *testing.T, s *framework.Stack, snapRepo string, a tenant, nss []string) {
	keyFile := filepath.Join(t.TempDir(), "token-key")
	if err := os.WriteFile(keyFile, []byte(rand.String(32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var rs [2]*tenantGateway
	for i := range rs {
		u, proc := launchGatewayAgent(t, s, "--namespaces", strings.Join(nss, ","), "--keys-secret", a.ns+"/e2b-keys",
			"--create-timeout", "90s", "--token-key-file", keyFile,
			"--template-upload-repository", snapRepo+"/e2b", "--template-upload-insecure",
			"--template-uploads", t.TempDir())
		rs[i] = &tenantGateway{url: u, proc: proc}
	}
	r0, r1 := rs[0], rs[1]

	// The COPY step's files, as the SDK uploads them: a gzipped tar of
	// the paths under the build's context.
	var tgz bytes.Buffer
	zw := gzip.NewWriter(&tgz)
	tw := tar.NewWriter(zw)
	const content = "uploaded to one replica, built by the other\n"
	for _, h := range []*tar.Header{
		{Name: "app/", Typeflag: tar.TypeDir, Mode: 0o755},
		{Name: "app/hello.txt", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(content))},
	} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tw.Write([]byte(content)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(tgz.Bytes())
	hash := hex.EncodeToString(sum[:])

	var req struct {
		TemplateID string `json:"templateID"`
		BuildID    string `json:"buildID"`
	}
	if code, body := r0.call(t, a.key, http.MethodPost, "/v3/templates", map[string]any{"name": "across-replicas"}, &req); code != http.StatusAccepted {
		t.Fatalf("request a build on replica 0: %d %s", code, body)
	}
	var up struct {
		Present bool    `json:"present"`
		URL     *string `json:"url"`
	}
	if code, body := r1.call(t, a.key, http.MethodGet, "/templates/"+req.TemplateID+"/files/"+hash, nil, &up); code != http.StatusCreated || up.Present || up.URL == nil {
		t.Fatalf("replica 1's upload URL for a build replica 0 was asked for: %d %s", code, body)
	}
	// The URL names replica 1; replica 0 takes it as well (one key signs).
	u, err := url.Parse(*up.URL)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = strings.TrimPrefix(r0.url, "http://")
	put, _ := http.NewRequestWithContext(t.Context(), http.MethodPut, u.String(), bytes.NewReader(tgz.Bytes()))
	resp, err := http.DefaultClient.Do(put)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("upload to replica 0 with replica 1's URL: %d", resp.StatusCode)
	}
	if code, body := r1.call(t, a.key, http.MethodGet, "/templates/"+req.TemplateID+"/files/"+hash, nil, &up); code != http.StatusOK || !up.Present {
		t.Fatalf("replica 1 does not see what replica 0 received: %d %s", code, body)
	}
	start := map[string]any{"fromImage": s.DebianImage, "steps": []map[string]any{
		{"type": "COPY", "args": []string{"app", "/srv/app/"}, "filesHash": hash},
		{"type": "RUN", "args": []string{"grep -qx 'uploaded to one replica, built by the other' /srv/app/hello.txt"}},
	}}
	if code, body := r1.call(t, a.key, http.MethodPost, "/v2/templates/"+req.TemplateID+"/builds/"+req.BuildID, start, nil); code != http.StatusAccepted {
		t.Fatalf("start the build on replica 1: %d %s", code, body)
	}
	st := waitBuild(t, rs[:], a.key, req.TemplateID, req.BuildID, func(st buildStatus) bool { return st.Status == "ready" || st.Status == "error" })
	if st.Status != "ready" {
		t.Fatalf("the build across replicas ended %s: %+v", st.Status, st.Reason)
	}
	// A sandbox of the template, made by replica 0, has the files.
	sb := r0.create(t, a.key, req.TemplateID, nil)
	if code, body, err := r1.sandboxGET(t, sb.SandboxID, sb.EnvdAccessToken, "/files?path=/srv/app/hello.txt&username=root"); err != nil || code != http.StatusOK || body != content {
		t.Errorf("the template's file through replica 1: %d %q %v", code, body, err)
	}
	_, _ = r0.call(t, a.key, http.MethodDelete, "/sandboxes/"+sb.SandboxID, nil, nil)

	// A build running on replica 0 when it is stopped.
	if code, body := r1.call(t, a.key, http.MethodPost, "/v3/templates", map[string]any{"name": "replica-stops"}, &req); code != http.StatusAccepted {
		t.Fatalf("request a build on replica 1: %d %s", code, body)
	}
	start = map[string]any{"fromImage": s.DebianImage, "steps": []map[string]any{
		{"type": "RUN", "args": []string{"echo started; sleep 600"}},
	}}
	if code, body := r0.call(t, a.key, http.MethodPost, "/v2/templates/"+req.TemplateID+"/builds/"+req.BuildID, start, nil); code != http.StatusAccepted {
		t.Fatalf("start the build on replica 0: %d %s", code, body)
	}
	waitBuild(t, rs[1:], a.key, req.TemplateID, req.BuildID, func(st buildStatus) bool { return st.Status == "building" })
	if err := r0.proc.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	st = waitBuild(t, rs[1:], a.key, req.TemplateID, req.BuildID, func(st buildStatus) bool { return st.Status != "building" && st.Status != "waiting" })
	<-r0.proc.done
	if r0.proc.err != nil {
		t.Errorf("replica 0 ended with %v on SIGTERM", r0.proc.err)
	}
	if st.Status != "error" || st.Reason == nil || !strings.Contains(st.Reason.Message, "replica running it is shutting down") {
		t.Errorf("a build whose replica stopped, read on the other: %s %+v, want an error saying its replica stopped", st.Status, st.Reason)
	}
	t.Logf("a build whose replica stopped: %s: %s", st.Status, st.Reason.Message)
}

// waitBuild polls a build's status on each of rs in turn until done
// says it is what the caller waits for, and returns it.
func waitBuild(t *testing.T, rs []*tenantGateway, key, templateID, buildID string, done func(buildStatus) bool) buildStatus {
	t.Helper()
	var st buildStatus
	n := 0
	framework.Eventually(t, 3*time.Minute, "build "+buildID+" on "+rs[0].url, func(context.Context) (bool, error) {
		g := rs[n%len(rs)]
		n++
		st = buildStatus{}
		if code, body := g.call(t, key, http.MethodGet, "/templates/"+templateID+"/builds/"+buildID+"/status", nil, &st); code != http.StatusOK {
			t.Fatalf("build status on %s: %d %s", g.url, code, body)
		}
		return done(st), nil
	})
	return st
}

package gateway

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	daemonapi "github.com/sandman-dev/sandman/daemon/api"
	procpb "github.com/sandman-dev/sandman/daemon/envd/spec/process"
	"github.com/sandman-dev/sandman/daemon/envd/spec/process/processconnect"
	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
	vkapi "github.com/sandman-dev/sandman/vk/api"
)

// ranCommand is a command the fake daemon was asked to run.
type ranCommand struct {
	shell, user, cwd string
	env              map[string]string
	token            string
}

// fakeProcs is a sandbox daemon's envd process service and v1 archive
// upload, recording what the gateway asks; a command's answer is found
// by a substring of it in answers (output, exit code).
type fakeProcs struct {
	processconnect.UnimplementedProcessHandler
	mu       sync.Mutex
	ran      []ranCommand
	tars     map[string][]byte // dir → archive
	answers  map[string]fakeAnswer
	readyAt  int // the ready command succeeds from this try on
	readyTry int
}

type fakeAnswer struct {
	out  string
	code int32
}

func newFakeProcs() *fakeProcs {
	return &fakeProcs{tars: map[string][]byte{}, answers: map[string]fakeAnswer{
		"id -un":                  {"root\n", 0},
		"/etc/passwd":             {"1000 1000 /home/user\n", 0},
		"exit 3":                  {"compiling...\nerror: no such module\n", 3},
		"python3 -c 'import app'": {"ok\n", 0},
	}}
}

func (f *fakeProcs) Start(_ context.Context, req *connect.Request[procpb.StartRequest], stream *connect.ServerStream[procpb.StartResponse]) error {
	cfg := req.Msg.GetProcess()
	c := ranCommand{env: cfg.GetEnvs(), cwd: cfg.GetCwd(), token: req.Header().Get("X-Access-Token")}
	if a := cfg.GetArgs(); len(a) == 4 {
		c.shell = a[3]
	}
	if v, ok := strings.CutPrefix(req.Header().Get("Authorization"), "Basic "); ok {
		b, _ := base64.StdEncoding.DecodeString(v)
		c.user = strings.TrimSuffix(string(b), ":")
	}
	f.mu.Lock()
	f.ran = append(f.ran, c)
	var ans fakeAnswer
	for k, a := range f.answers {
		if strings.Contains(c.shell, k) {
			ans = a
		}
	}
	if strings.Contains(c.shell, "ready-check") {
		f.readyTry++
		if f.readyTry < f.readyAt {
			ans = fakeAnswer{"not yet\n", 1}
		}
	}
	f.mu.Unlock()
	send := func(ev *procpb.ProcessEvent) error { return stream.Send(&procpb.StartResponse{Event: ev}) }
	if err := send(&procpb.ProcessEvent{Event: &procpb.ProcessEvent_Start{Start: &procpb.ProcessEvent_StartEvent{Pid: 42}}}); err != nil {
		return err
	}
	if strings.Contains(c.shell, "serve-forever") {
		return nil // a start command: the stream ends, the process would run on
	}
	if ans.out != "" {
		if err := send(&procpb.ProcessEvent{Event: &procpb.ProcessEvent_Data{Data: &procpb.ProcessEvent_DataEvent{
			Output: &procpb.ProcessEvent_DataEvent_Stdout{Stdout: []byte(ans.out)}}}}); err != nil {
			return err
		}
	}
	return send(&procpb.ProcessEvent{Event: &procpb.ProcessEvent_End{End: &procpb.ProcessEvent_EndEvent{Exited: true, ExitCode: ans.code}}})
}

func (f *fakeProcs) handler() http.Handler {
	mux := http.NewServeMux()
	path, h := processconnect.NewProcessHandler(f)
	mux.Handle(path, h)
	mux.HandleFunc("PUT /v1/files", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.tars[r.URL.Query().Get("path")] = b
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"path":"` + r.URL.Query().Get("path") + `"}`))
	})
	return mux
}

func (f *fakeProcs) commands() []ranCommand {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]ranCommand(nil), f.ran...)
}

// buildEnv is a gateway whose virtual node snapshots into snaps and whose
// sandboxes' daemon is procs.
type buildEnv struct {
	*env
	procs *fakeProcs
	mu    sync.Mutex
	snaps []vkapi.SnapshotRequest
}

func newBuildEnv(t *testing.T, tweak ...func(*Config)) *buildEnv {
	b := &buildEnv{procs: newFakeProcs()}
	b.env = newEnv(t, func(c *Config) {
		c.UploadDir = t.TempDir()
		c.BuildCheckpointAfter = -1
		for _, f := range tweak {
			f(c)
		}
		c.Snapshot = func(_ context.Context, _ string, req vkapi.SnapshotRequest) (runtime.SnapshotResult, error) {
			b.mu.Lock()
			b.snaps = append(b.snaps, req)
			b.mu.Unlock()
			return runtime.SnapshotResult{Image: "reg.local/" + req.Image, Digest: fakeDigest}, nil
		}
	})
	b.setDaemon(b.procs.handler())
	return b
}

func (b *buildEnv) snapshots() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.snaps)
}

// projectTar is a gzipped tar of app/main.py, as the SDK uploads a copy
// of the directory app.
func projectTar(t *testing.T) []byte {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tw := tar.NewWriter(zw)
	body := []byte("print('hi')\n")
	_ = tw.WriteHeader(&tar.Header{Name: "app/", Typeflag: tar.TypeDir, Mode: 0o755})
	_ = tw.WriteHeader(&tar.Header{Name: "app/main.py", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
	_, _ = tw.Write(body)
	_ = tw.Close()
	_ = zw.Close()
	return buf.Bytes()
}

const filesHash = "5e1f0a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f"

// steps is a 5-step template: every step kind.
func steps() []templateStep {
	return []templateStep{
		{Type: "RUN", Args: []string{"apt-get install -y python3", "root"}},
		{Type: "COPY", Args: []string{"app", "app/", "", "0755"}, FilesHash: filesHash},
		{Type: "ENV", Args: []string{"APP_MODE", "test", "PYTHONPATH", "/srv/app"}},
		{Type: "USER", Args: []string{"user"}},
		{Type: "WORKDIR", Args: []string{"/srv/app"}},
		{Type: "RUN", Args: []string{"python3 -c 'import app'"}},
	}
}

// requestBuild is POST /v3/templates.
func (b *buildEnv) requestBuild(key, name string) templateRequestResponse {
	b.t.Helper()
	r := b.call(http.MethodPost, "/v3/templates", key, map[string]any{"name": name, "cpuCount": 2, "memoryMB": 1024})
	if r.status != http.StatusAccepted {
		b.t.Fatalf("request build: %d %s", r.status, r.body)
	}
	var res templateRequestResponse
	r.decode(b.t, &res)
	return res
}

// upload asks for the files' upload link and PUTs them if asked to.
func (b *buildEnv) upload(key, templateID string, body []byte) (uploaded bool) {
	b.t.Helper()
	r := b.call(http.MethodGet, "/templates/"+templateID+"/files/"+filesHash, key, nil)
	var fu fileUpload
	r.decode(b.t, &fu)
	if fu.Present {
		return false
	}
	if r.status != http.StatusCreated || fu.URL == nil {
		b.t.Fatalf("files link: %d %s", r.status, r.body)
	}
	req, _ := http.NewRequest(http.MethodPut, *fu.URL, bytes.NewReader(body))
	resp, err := b.http.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.t.Fatalf("upload: %d", resp.StatusCode)
	}
	return true
}

// waitBuild polls the build's status until it ends, gathering its logs as
// the SDK does (logsOffset).
func (b *buildEnv) waitBuild(key string, res templateRequestResponse) (templateBuildInfo, []buildLogEntry) {
	b.t.Helper()
	var logs []buildLogEntry
	var info templateBuildInfo
	poll(b.t, "build "+res.BuildID+" to end", func() bool {
		r := b.call(http.MethodGet, "/templates/"+res.TemplateID+"/builds/"+res.BuildID+"/status?logsOffset="+strconv.Itoa(len(logs)), key, nil)
		if r.status != http.StatusOK {
			b.t.Fatalf("status: %d %s", r.status, r.body)
		}
		info = templateBuildInfo{}
		r.decode(b.t, &info)
		logs = append(logs, info.LogEntries...)
		return info.Status == buildReady || info.Status == buildError
	})
	return info, logs
}

// readyBuildPod makes the build's sandbox pod ready once it appears.
func (b *buildEnv) readyBuildPod(ns string) corev1.Pod {
	b.t.Helper()
	var pod corev1.Pod
	poll(b.t, "a build sandbox", func() bool {
		for _, p := range b.sandboxPods(ns) {
			if p.Labels[podcontract.LabelE2BBuild] != "" {
				pod = p
				return true
			}
		}
		return false
	})
	b.setStatus(ns, pod.Name, ready(daemonAddr))
	return pod
}

func logText(logs []buildLogEntry) string {
	var s []string
	for _, l := range logs {
		s = append(s, l.Message)
	}
	return strings.Join(s, "\n")
}

// TestTemplateBuildFromCode: a template built from code runs each step in
// a build sandbox (users, env, working directory, the uploaded files),
// is snapshotted and registered; a sandbox made from it starts with its
// env, working directory, user and start command; a rebuild of the same
// steps reuses the image at once.
func TestTemplateBuildFromCode(t *testing.T) {
	b := newBuildEnv(t)
	res := b.requestBuild(rawKeyA, "py-app")
	if res.TemplateID == "" || !buildIDRE.MatchString(res.BuildID) || res.Tags[0] != defaultTag {
		t.Fatalf("request: %+v", res)
	}
	if !b.upload(rawKeyA, res.TemplateID, projectTar(t)) {
		t.Fatal("files reported present before any upload")
	}
	start := map[string]any{"fromTemplate": "base", "steps": steps(), "startCmd": "serve-forever --port 8000", "readyCmd": "ready-check 8000"}
	r := b.call(http.MethodPost, "/v2/templates/"+res.TemplateID+"/builds/"+res.BuildID, rawKeyA, start)
	if r.status != http.StatusAccepted {
		t.Fatalf("start build: %d %s", r.status, r.body)
	}
	pod := b.readyBuildPod(nsA)
	info, logs := b.waitBuild(rawKeyA, res)
	if info.Status != buildReady {
		t.Fatalf("build: %+v\nlogs:\n%s", info.Reason, logText(logs))
	}
	for _, want := range []string{"[1/6] RUN apt-get install -y python3 (as root)", "[2/6] COPY app app/", "ok", "Snapshot reg.local/e2b/" + nsA + "/template-py-app:" + res.BuildID} {
		if !strings.Contains(logText(logs), want) {
			t.Errorf("logs lack %q:\n%s", want, logText(logs))
		}
	}

	// What ran, as whom (the fake /etc/passwd gives every user /home/user).
	token := b.gw.cfg.Tokens.New(nsA, pod.Name)
	var sawCopy, sawRun bool
	for _, c := range b.procs.commands() {
		if c.token != token {
			t.Errorf("command %q with token %q", c.shell, c.token)
		}
		if c.shell == "apt-get install -y python3" && c.user != "root" {
			t.Errorf("RUN as root ran as %q", c.user)
		}
		if strings.Contains(c.shell, "cp -a") {
			sawCopy = true
			if c.user != "root" || c.env["T"] != "/home/user/app/" || c.env["O"] != "root:" || c.env["M"] != "0755" ||
				!strings.HasSuffix(c.env["P"], "/app") {
				t.Errorf("COPY ran %+v", c)
			}
		}
		if c.shell == "python3 -c 'import app'" {
			sawRun = true
			if c.user != "user" || c.cwd != "/srv/app" || c.env["APP_MODE"] != "test" || c.env["PYTHONPATH"] != "/srv/app" {
				t.Errorf("last RUN ran %+v", c)
			}
		}
	}
	if !sawCopy || !sawRun {
		t.Errorf("commands: copy %v, last run %v: %+v", sawCopy, sawRun, b.procs.commands())
	}
	if len(b.procs.tars) != 1 {
		t.Errorf("archives unpacked: %d", len(b.procs.tars))
	}
	for _, tarball := range b.procs.tars {
		if tr := tar.NewReader(bytes.NewReader(tarball)); func() bool { h, err := tr.Next(); return err != nil || h.Name != "app/" }() {
			t.Errorf("the sandbox got no plain tar of app/")
		}
	}
	// Nothing left: the build's sandbox and its uploads.
	poll(t, "the build sandbox deleted", func() bool {
		_, err := b.client.CoreV1().Pods(nsA).Get(context.Background(), pod.Name, metav1.GetOptions{})
		return err != nil
	})
	if b.gw.hasUpload(nsA, filesHash) {
		t.Error("the upload outlived its build")
	}

	// A sandbox from it.
	b.procs.readyAt = 3
	sb, spod := b.createReady(rawKeyA, nsA, map[string]any{"templateID": "py-app", "envVars": map[string]string{"APP_MODE": "prod"}})
	if sb.Alias != "py-app" {
		t.Errorf("sandbox alias %q", sb.Alias)
	}
	c := spod.Spec.Containers[0]
	envs := map[string]string{}
	for _, e := range c.Env {
		envs[e.Name] = e.Value
	}
	if c.Image != "reg.local/e2b/"+nsA+"/template-py-app:"+res.BuildID+"@"+fakeDigest || c.WorkingDir != "/srv/app" ||
		envs["APP_MODE"] != "prod" || envs["PYTHONPATH"] != "/srv/app" || envs["HOME"] != "/home/user" ||
		c.SecurityContext == nil || *c.SecurityContext.RunAsUser != 0 || *c.SecurityContext.RunAsGroup != 0 || envs[daemonapi.EnvEnvdUser] != "user" {
		// The template's user is E2B's default user: the daemon runs as
		// root, as E2B's envd does, and calls naming none act as user.
		t.Errorf("sandbox container %+v", c)
	}
	var started, readyTries int
	for _, cmd := range b.procs.commands() {
		if cmd.shell == "serve-forever --port 8000" && cmd.user == "user" && cmd.cwd == "/srv/app" && cmd.env["APP_MODE"] == "prod" {
			started++
		}
		if cmd.shell == "ready-check 8000" {
			readyTries++
		}
	}
	if started != 1 || readyTries != 3 {
		t.Errorf("start command started %d times, ready command tried %d times (want 1, 3)", started, readyTries)
	}

	// A rebuild of the same steps: cached, no sandbox, no snapshot.
	snaps := b.snapshots()
	res2 := b.requestBuild(rawKeyA, "py-app:v2")
	if res2.TemplateID != res.TemplateID || res2.BuildID == res.BuildID {
		t.Fatalf("rebuild: %+v after %+v", res2, res)
	}
	b.upload(rawKeyA, res2.TemplateID, projectTar(t))
	r = b.call(http.MethodPost, "/v2/templates/"+res2.TemplateID+"/builds/"+res2.BuildID, rawKeyA, start)
	if r.status != http.StatusAccepted {
		t.Fatalf("start rebuild: %d %s", r.status, r.body)
	}
	info, logs = b.waitBuild(rawKeyA, res2)
	if info.Status != buildReady || !strings.Contains(logText(logs), "CACHED [6/6]") || b.snapshots() != snaps {
		t.Fatalf("rebuild: %s %+v, snapshots %d → %d\n%s", info.Status, info.Reason, snaps, b.snapshots(), logText(logs))
	}
	for _, p := range b.sandboxPods(nsA) {
		if p.Labels[podcontract.LabelE2BBuild] == res2.BuildID {
			t.Error("a cached rebuild made a sandbox")
		}
	}
	// Tags: v2 and default, both the rebuild's.
	r = b.call(http.MethodGet, "/templates/"+res.TemplateID+"/tags", rawKeyA, nil)
	var tags []templateTag
	r.decode(t, &tags)
	if len(tags) != 2 || tags[0].Tag != "default" || tags[1].Tag != "v2" || tags[0].BuildID != res.BuildID || tags[1].BuildID != res2.BuildID {
		t.Errorf("tags %s", r.body)
	}
	// A changed step builds again.
	res3 := b.requestBuild(rawKeyA, "py-app")
	b.upload(rawKeyA, res3.TemplateID, projectTar(t))
	changed := steps()
	changed[5].Args[0] = "python3 -c 'import app' && true"
	r = b.call(http.MethodPost, "/v2/templates/"+res3.TemplateID+"/builds/"+res3.BuildID, rawKeyA, map[string]any{"fromTemplate": "base", "steps": changed})
	if r.status != http.StatusAccepted {
		t.Fatalf("start changed build: %d %s", r.status, r.body)
	}
	b.readyBuildPod(nsA)
	if info, logs = b.waitBuild(rawKeyA, res3); info.Status != buildReady || b.snapshots() != snaps+1 {
		t.Fatalf("changed build: %s %+v snapshots %d\n%s", info.Status, info.Reason, b.snapshots(), logText(logs))
	}

	// exists
	if r := b.call(http.MethodGet, "/templates/aliases/py-app", rawKeyA, nil); r.status != http.StatusOK {
		t.Errorf("exists: %d", r.status)
	}
	if r := b.call(http.MethodGet, "/templates/aliases/nope", rawKeyA, nil); r.status != http.StatusNotFound {
		t.Errorf("exists of none: %d", r.status)
	}
}

// TestTemplateBuildStepFails: a failing step fails the build with its
// output and step number; its sandbox and uploads are gone.
func TestTemplateBuildStepFails(t *testing.T) {
	b := newBuildEnv(t)
	res := b.requestBuild(rawKeyA, "broken")
	b.upload(rawKeyA, res.TemplateID, projectTar(t))
	bad := steps()
	bad[0] = templateStep{Type: "RUN", Args: []string{"make && exit 3"}}
	r := b.call(http.MethodPost, "/v2/templates/"+res.TemplateID+"/builds/"+res.BuildID, rawKeyA, map[string]any{"fromImage": "registry.example.com/x:1", "steps": bad})
	if r.status != http.StatusAccepted {
		t.Fatalf("start: %d %s", r.status, r.body)
	}
	pod := b.readyBuildPod(nsA)
	info, _ := b.waitBuild(rawKeyA, res)
	if info.Status != buildError || info.Reason == nil || info.Reason.Step != "1" ||
		!strings.Contains(info.Reason.Message, "exit code 3") || !strings.Contains(info.Reason.Message, "error: no such module") {
		t.Fatalf("failed build: %s %+v", info.Status, info.Reason)
	}
	poll(t, "the build sandbox deleted", func() bool {
		_, err := b.client.CoreV1().Pods(nsA).Get(context.Background(), pod.Name, metav1.GetOptions{})
		return err != nil
	})
	if b.gw.hasUpload(nsA, filesHash) || b.snapshots() != 0 {
		t.Errorf("after a failed build: upload %v, snapshots %d", b.gw.hasUpload(nsA, filesHash), b.snapshots())
	}
	// Create from a template with no finished build: 404.
	if r := b.call(http.MethodPost, "/v2/sandboxes", rawKeyA, map[string]any{"templateID": "broken"}); r.status != http.StatusNotFound {
		t.Errorf("create from an unbuilt template: %d %s", r.status, r.body)
	}
}

// TestTemplateNamespaces: a template is its namespace's: another
// namespace's key neither sees nor builds it, and the same name there is
// another template.
func TestTemplateNamespaces(t *testing.T) {
	b := newBuildEnv(t)
	res := b.requestBuild(rawKeyA, "shared-name")
	b.upload(rawKeyA, res.TemplateID, projectTar(t))
	r := b.call(http.MethodPost, "/v2/templates/"+res.TemplateID+"/builds/"+res.BuildID, rawKeyA, map[string]any{"fromTemplate": "base", "steps": steps()})
	if r.status != http.StatusAccepted {
		t.Fatalf("start: %d %s", r.status, r.body)
	}
	b.readyBuildPod(nsA)
	if info, _ := b.waitBuild(rawKeyA, res); info.Status != buildReady {
		t.Fatalf("build: %+v", info.Reason)
	}
	for _, c := range []struct{ method, path string }{
		{http.MethodGet, "/templates/" + res.TemplateID + "/builds/" + res.BuildID + "/status"},
		{http.MethodGet, "/templates/" + res.TemplateID + "/files/" + filesHash},
		{http.MethodGet, "/templates/" + res.TemplateID + "/tags"},
		{http.MethodGet, "/templates/aliases/shared-name"},
	} {
		if r := b.call(c.method, c.path, rawKeyB, nil); r.status != http.StatusNotFound {
			t.Errorf("%s %s with another namespace's key: %d %s", c.method, c.path, r.status, r.body)
		}
	}
	if r := b.call(http.MethodPost, "/v2/sandboxes", rawKeyB, map[string]any{"templateID": "shared-name"}); r.status != http.StatusNotFound {
		t.Errorf("create from another namespace's template: %d %s", r.status, r.body)
	}
	if r := b.call(http.MethodPost, "/v2/sandboxes", rawKeyB, map[string]any{"templateID": res.TemplateID}); r.status != http.StatusNotFound {
		t.Errorf("create from another namespace's template ID: %d %s", r.status, r.body)
	}
	// Its image, named directly, is refused too.
	if r := b.call(http.MethodPost, "/v2/sandboxes", rawKeyB, map[string]any{"templateID": "reg.local/e2b/" + nsA + "/template-shared-name:" + res.BuildID + "@" + fakeDigest}); r.status != http.StatusForbidden {
		t.Errorf("create from another namespace's template image: %d %s", r.status, r.body)
	}
	resB := b.requestBuild(rawKeyB, "shared-name")
	if resB.TemplateID == res.TemplateID {
		t.Errorf("the same name in another namespace is the same template %s", res.TemplateID)
	}
	// An operator's template name is not a namespace's to build.
	if r := b.call(http.MethodPost, "/v3/templates", rawKeyA, map[string]any{"name": "base"}); r.status != http.StatusConflict {
		t.Errorf("build named as the operator's template: %d %s", r.status, r.body)
	}
}

// TestTemplateUploadChecks: uploads need the signed URL, unexpired, for
// their namespace, and within the size cap.
func TestTemplateUploadChecks(t *testing.T) {
	b := newBuildEnv(t)
	b.gw.cfg.MaxUploadBytes = 1 << 10
	res := b.requestBuild(rawKeyA, "up")
	r := b.call(http.MethodGet, "/templates/"+res.TemplateID+"/files/"+filesHash, rawKeyA, nil)
	var fu fileUpload
	r.decode(t, &fu)
	u, _ := url.Parse(*fu.URL)
	put := func(u *url.URL, body []byte) int {
		req, _ := http.NewRequest(http.MethodPut, u.String(), bytes.NewReader(body))
		resp, err := b.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	q := u.Query()
	other := *u
	q2 := url.Values{}
	for k, v := range q {
		q2[k] = v
	}
	q2.Set("namespace", nsB)
	other.RawQuery = q2.Encode()
	if s := put(&other, []byte("x")); s != http.StatusUnauthorized {
		t.Errorf("upload signed for another namespace: %d", s)
	}
	if s := put(u, bytes.Repeat([]byte("x"), 2<<10)); s != http.StatusRequestEntityTooLarge {
		t.Errorf("oversized upload: %d", s)
	}
	if b.gw.hasUpload(nsA, filesHash) {
		t.Error("an oversized upload was kept")
	}
	if s := put(u, []byte("small")); s != http.StatusOK || !b.gw.hasUpload(nsA, filesHash) {
		t.Errorf("upload: %d", s)
	}
	entries, _ := os.ReadDir(b.gw.cfg.UploadDir + "/" + nsA)
	if len(entries) != 1 {
		t.Errorf("upload dir holds %d files", len(entries))
	}
	// A bad build request.
	if r := b.call(http.MethodPost, "/v3/templates", rawKeyA, map[string]any{"name": "Bad Name"}); r.status != http.StatusBadRequest {
		t.Errorf("bad name: %d", r.status)
	}
	if r := b.call(http.MethodPost, "/v2/templates/"+res.TemplateID+"/builds/"+res.BuildID, rawKeyA,
		map[string]any{"fromImage": "registry.example.com/x:1", "steps": []templateStep{{Type: "HEALTHCHECK", Args: []string{"x"}}}}); r.status != http.StatusBadRequest {
		t.Errorf("unknown step: %d %s", r.status, r.body)
	}
}

// TestTemplateBuildCheckpoints: slow steps are checkpointed, and a build
// that changes only the last step starts from the checkpoint before it.
func TestTemplateBuildCheckpoints(t *testing.T) {
	b := newBuildEnv(t, func(c *Config) {
		c.Now = time.Now // steps take time
		c.BuildCheckpointAfter = time.Nanosecond
	})
	res := b.requestBuild(rawKeyA, "slow")
	b.upload(rawKeyA, res.TemplateID, projectTar(t))
	r := b.call(http.MethodPost, "/v2/templates/"+res.TemplateID+"/builds/"+res.BuildID, rawKeyA, map[string]any{"fromTemplate": "base", "steps": steps()})
	if r.status != http.StatusAccepted {
		t.Fatalf("start: %d %s", r.status, r.body)
	}
	b.readyBuildPod(nsA)
	if info, logs := b.waitBuild(rawKeyA, res); info.Status != buildReady || b.snapshots() != 6 {
		t.Fatalf("build: %s %+v, %d snapshots (want 5 checkpoints and the result)\n%s", info.Status, info.Reason, b.snapshots(), logText(logs))
	}

	res2 := b.requestBuild(rawKeyA, "slow")
	b.upload(rawKeyA, res2.TemplateID, projectTar(t))
	changed := steps()
	changed[5].Args[0] = "python3 -c 'import app' # changed"
	r = b.call(http.MethodPost, "/v2/templates/"+res2.TemplateID+"/builds/"+res2.BuildID, rawKeyA, map[string]any{"fromTemplate": "base", "steps": changed})
	if r.status != http.StatusAccepted {
		t.Fatalf("start: %d %s", r.status, r.body)
	}
	pod := b.readyBuildPod(nsA)
	want := "reg.local/e2b/" + nsA + "/template-slow:" + res.BuildID + "-step5@" + fakeDigest
	if img := pod.Spec.Containers[0].Image; img != want {
		t.Errorf("the second build's sandbox runs %s, want the checkpoint %s", img, want)
	}
	info, logs := b.waitBuild(rawKeyA, res2)
	if info.Status != buildReady || b.snapshots() != 7 || !strings.Contains(logText(logs), "CACHED [5/6]") || strings.Contains(logText(logs), "\n[1/6] RUN") {
		t.Fatalf("second build: %s %+v, %d snapshots\n%s", info.Status, info.Reason, b.snapshots(), logText(logs))
	}
	for _, c := range b.procs.commands() {
		if c.shell == "python3 -c 'import app' # changed" && (c.user != "user" || c.cwd != "/srv/app" || c.env["APP_MODE"] != "test") {
			t.Errorf("the changed step ran without the checkpoint's state: %+v", c)
		}
	}
}

// TestTemplateBuildPrivateBase: fromImageRegistry's credentials reach the
// build sandbox's pull as a dockerconfigjson Secret of the key's namespace
// for the image's registry, named in the pod's imagePullSecrets, and the
// Secret is gone once the sandbox started. AWS's (a token from AWS's API)
// is 501; credentials that are not whole, or without fromImage, 400.
func TestTemplateBuildPrivateBase(t *testing.T) {
	b := newBuildEnv(t)
	ctx := context.Background()
	res := b.requestBuild(rawKeyA, "private")
	start := func(body map[string]any) response {
		return b.call(http.MethodPost, "/v2/templates/"+res.TemplateID+"/builds/"+res.BuildID, rawKeyA, body)
	}
	for _, tc := range []struct {
		body   map[string]any
		status int
		says   string
	}{
		{map[string]any{"fromImage": "reg.example.com:5000/x:1", "fromImageRegistry": map[string]any{"type": "aws", "awsAccessKeyId": "a", "awsSecretAccessKey": "s", "awsRegion": "r"}}, http.StatusNotImplemented, "get-login-password"},
		{map[string]any{"fromImage": "reg.example.com:5000/x:1", "fromImageRegistry": map[string]any{"type": "registry", "username": "u"}}, http.StatusBadRequest, "username and password"},
		{map[string]any{"fromImage": "reg.example.com:5000/x:1", "fromImageRegistry": map[string]any{"type": "gcp", "serviceAccountJson": "{not json"}}, http.StatusBadRequest, "JSON key"},
		{map[string]any{"fromTemplate": "base", "fromImageRegistry": map[string]any{"type": "registry", "username": "u", "password": "p"}}, http.StatusBadRequest, "fromImage"},
	} {
		tc.body["steps"] = []templateStep{{Type: "RUN", Args: []string{"true"}}}
		if r := start(tc.body); r.status != tc.status || !strings.Contains(r.apiError(t).Message, tc.says) {
			t.Errorf("start %v: %d %s, want %d saying %q", tc.body["fromImageRegistry"], r.status, r.body, tc.status, tc.says)
		}
	}

	r := start(map[string]any{"fromImage": "reg.example.com:5000/private/x:1", "steps": []templateStep{{Type: "RUN", Args: []string{"true"}}},
		"fromImageRegistry": map[string]any{"type": "registry", "username": "trainer", "password": "s3cret"}})
	if r.status != http.StatusAccepted {
		t.Fatalf("start: %d %s", r.status, r.body)
	}
	var pod corev1.Pod
	poll(t, "a build sandbox", func() bool {
		for _, p := range b.sandboxPods(nsA) {
			if p.Labels[podcontract.LabelE2BBuild] != "" {
				pod = p
				return true
			}
		}
		return false
	})
	if len(pod.Spec.ImagePullSecrets) != 1 {
		t.Fatalf("the build pod's imagePullSecrets: %v", pod.Spec.ImagePullSecrets)
	}
	// A build's sandbox is not the caller's to list, as in E2B.
	b.cached(nsA, pod.Name, func(*corev1.Pod) bool { return true })
	if r := b.call(http.MethodGet, "/v2/sandboxes", rawKeyA, nil); strings.Contains(string(r.body), pod.Name) {
		t.Errorf("the build's sandbox is listed: %s", r.body)
	}
	sec, err := b.client.CoreV1().Secrets(nsA).Get(ctx, pod.Spec.ImagePullSecrets[0].Name, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the pull secret: %v", err)
	}
	var cfg struct {
		Auths map[string]struct{ Auth string } `json:"auths"`
	}
	if err := json.Unmarshal(sec.Data[corev1.DockerConfigJsonKey], &cfg); err != nil || sec.Type != corev1.SecretTypeDockerConfigJson ||
		cfg.Auths["reg.example.com:5000"].Auth != base64.StdEncoding.EncodeToString([]byte("trainer:s3cret")) {
		t.Fatalf("the pull secret: type %s, %s (%v)", sec.Type, sec.Data[corev1.DockerConfigJsonKey], err)
	}
	b.setStatus(nsA, pod.Name, ready(daemonAddr))
	if info, _ := b.waitBuild(rawKeyA, res); info.Status != buildReady {
		t.Fatalf("build: %s %+v", info.Status, info.Reason)
	}
	if _, err := b.client.CoreV1().Secrets(nsA).Get(ctx, sec.Name, metav1.GetOptions{}); err == nil {
		t.Errorf("the pull secret %s outlived the build", sec.Name)
	}
}

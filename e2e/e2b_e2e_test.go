//go:build e2e

package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/reflect/protoreflect"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/sandman-dev/sandman/daemon/envd/spec/filesystem"
	"github.com/sandman-dev/sandman/daemon/envd/spec/process"
	"github.com/sandman-dev/sandman/e2e/e2bsdk"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
)

var (
	sdkOnce sync.Once
	sdkErr  string
)

// e2bSDK installs the pinned E2B SDK (e2e/e2b/package-lock.json) with
// npm ci, once per test binary, and returns its directory.
func e2bSDK(t *testing.T, root string) string {
	t.Helper()
	dir := filepath.Join(root, "e2e", "e2b")
	sdkOnce.Do(func() {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", "e2b", "package.json")); err == nil {
			return
		}
		cmd := exec.Command("npm", "ci", "--no-audit", "--no-fund")
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			sdkErr = err.Error() + "\n" + string(out)
		}
	})
	if sdkErr != "" {
		t.Fatalf("npm ci in %s: %s", dir, sdkErr)
	}
	return dir
}

// TestE2BWireFormatMatchesSDK: the envd protocol the daemon serves
// describes the same messages, fields and methods as the descriptors the
// pinned SDK carries.
func TestE2BWireFormatMatchesSDK(t *testing.T) {
	s := framework.Get(t)
	descs, err := e2bsdk.Descriptors(filepath.Join(e2bSDK(t, s.Root), "node_modules", "e2b"))
	if err != nil {
		t.Fatal(err)
	}
	for _, ours := range []protoreflect.FileDescriptor{process.File_process_process_proto, filesystem.File_filesystem_filesystem_proto} {
		sdk, ok := descs[ours.Path()]
		if !ok {
			t.Errorf("the SDK carries no %s", ours.Path())
			continue
		}
		if err := e2bsdk.Compare(ours, sdk); err != nil {
			t.Error(err)
		}
	}
}

// TestE2BSDK: the official E2B SDK, unchanged, drives sandboxes through
// sandman-gateway (e2e/e2b/*.test.mjs hold its calls and assertions, a
// file per area, run one after another); afterwards the Go side checks
// what the SDK cannot see: the killed sandbox's slot is free, the expired
// one was reclaimed with an event.
func TestE2BSDK(t *testing.T) {
	s := framework.Get(t)
	sdk := e2bSDK(t, s.Root)
	// The pool's agents push snapshots (createSnapshot, templates built
	// from code) under a repository of their own in the stack's registry.
	snapRepo := s.Registry + "/sandman-e2e-e2b-" + rand.String(4)
	// The pool lets the test's namespace run sandboxes without
	// no_new_privs: E2B's base template sudoes.
	p := startPoolWith(t, s, poolOptions{agents: 1, slots: 6,
		agentArgs: []string{"--snapshot-registry", snapRepo, "--snapshot-repository", snapRepo + "/e2b"},
		vkArgs:    func(p *vpool) []string { return []string{"--privilege-escalation-namespaces", p.ns} }})
	ctx := t.Context()
	needRunsc(t, s)
	ensureRuntimeClass(t, s, "gvisor", runtime.RuntimeHandlerRunsc)
	g := startGateway(t, s, p)
	// A private base image for fromImageRegistry: the stack's busybox in a
	// registry that wants credentials.
	privHost := startAuthRegistry(t, s, "trainer", "s3cret")
	privImage := copyImage(t, s.BusyboxImage, privHost+"/private/busybox:1", "trainer", "s3cret")

	files, err := filepath.Glob(filepath.Join(sdk, "*.test.mjs"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no SDK test files in %s: %v", sdk, err)
	}
	state := filepath.Join(t.TempDir(), "state.json")
	args := []string{"--test", "--test-reporter=spec", "--test-concurrency=1"}
	if pat := os.Getenv("E2B_TEST_PATTERN"); pat != "" {
		args = append(args, "--test-name-pattern="+pat)
	}
	for _, f := range files {
		args = append(args, filepath.Base(f))
	}
	cmd := exec.CommandContext(ctx, "node", args...)
	cmd.Dir = sdk
	cmd.Env = append(os.Environ(),
		"E2B_API_URL="+g.url, "E2B_SANDBOX_URL="+g.url, "E2B_API_KEY="+g.key,
		"SANDMAN_TEMPLATE=debian", "SANDMAN_BASE_TEMPLATE=base", "SANDMAN_GVISOR_TEMPLATE=gvisor", "SANDMAN_IMAGE="+s.DebianImage,
		"SANDMAN_SNAPSHOT_REGISTRY="+snapRepo, "SANDMAN_STATE_FILE="+state,
		"SANDMAN_PRIVATE_IMAGE="+privImage, "SANDMAN_PRIVATE_USER=trainer", "SANDMAN_PRIVATE_PASSWORD=s3cret")
	out, err := cmd.CombinedOutput()
	t.Logf("the SDK's run:\n%s", out)
	if err != nil {
		t.Fatalf("the E2B SDK's calls failed: %v", err)
	}

	// Until nothing holds a pod, releases included: a sandbox that wrote a
	// lot can take seconds to unmount.
	framework.Eventually(t, 2*time.Minute, "the agent to hold no sandbox", func(ctx context.Context) (bool, error) {
		inv, err := p.agents[0].client.Inventory(ctx)
		if err != nil {
			return false, nil
		}
		for _, sl := range inv.Slots {
			if sl.Pod != nil {
				return false, nil
			}
		}
		return true, nil
	})
	if os.Getenv("E2B_TEST_PATTERN") != "" {
		return // a part of the SDK's calls: the state below is not all there
	}
	var ids struct{ Main, Expiring string }
	b, err := os.ReadFile(state)
	if err != nil || json.Unmarshal(b, &ids) != nil || ids.Main == "" || ids.Expiring == "" {
		t.Fatalf("state the SDK run left: %s %v", b, err)
	}
	for _, id := range []string{ids.Main, ids.Expiring} {
		framework.Eventually(t, time.Minute, "pod "+id+" gone", func(ctx context.Context) (bool, error) {
			_, err := s.Kube.CoreV1().Pods(p.ns).Get(ctx, id, metav1.GetOptions{})
			return apierrors.IsNotFound(err), nil
		})
	}
	evs, err := s.Kube.CoreV1().Events(p.ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + ids.Expiring})
	if err != nil {
		t.Fatal(err)
	}
	expired := false
	for _, ev := range evs.Items {
		expired = expired || ev.Reason == podcontract.ReasonExpired
	}
	if !expired {
		t.Errorf("no %s event on %s: %+v", podcontract.ReasonExpired, ids.Expiring, evs.Items)
	}
}

// gateway is a running sandman-gateway with one API key for a pool.
type gateway struct {
	url, key string
}

// startGateway runs sandman-gateway for pool p: one key for p's
// namespace, templates "debian" (the stack's Debian image, root),
// "base" (E2B's base template: the same as user `user`) and "gvisor" (the
// Debian image under gVisor, whose sandboxes can be paused).
func startGateway(t *testing.T, s *framework.Stack, p *vpool) *gateway {
	t.Helper()
	ctx := t.Context()
	key := "e2b_" + strings.Repeat("5a", 20)
	sum := sha256.Sum256([]byte(key))
	keyJSON, _ := json.Marshal(map[string]string{"sha256": hex.EncodeToString(sum[:]), "namespace": p.ns, "pool": p.name})
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "e2b-keys", Namespace: p.ns}, Data: map[string][]byte{"trainer": keyJSON}}
	if _, err := s.Kube.CoreV1().Secrets(p.ns).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tmplJSON, _ := json.Marshal(map[string]string{"image": s.DebianImage, "cpu": "250m", "memory": "256Mi"})
	baseJSON, _ := json.Marshal(map[string]any{"image": s.E2BBaseImage, "cpu": "250m", "memory": "256Mi", "allowPrivilegeEscalation": true, "user": "user"})
	gvisorJSON, _ := json.Marshal(map[string]string{"image": s.DebianImage, "cpu": "250m", "memory": "256Mi", "runtimeClassName": "gvisor"})
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "e2b-templates", Namespace: p.ns},
		Data: map[string]string{"debian": string(tmplJSON), "base": string(baseJSON), "gvisor": string(gvisorJSON)}}
	if _, err := s.Kube.CoreV1().ConfigMaps(p.ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Sandbox ports from 1024 up: ports.test.mjs checks that a port below
	// is closed by the sandbox's own firewall.
	url := launchGateway(t, s, "--namespace", p.ns, "--keys-secret", p.ns+"/e2b-keys", "--templates-configmap", p.ns+"/e2b-templates",
		"--sandbox-ports", "1024-65535")
	return &gateway{url: url, key: key}
}

// launchGateway runs sandman-gateway with args besides its kubeconfig,
// listen address and a token key of its own, waits for it to serve and
// returns its URL. It is stopped before the cleanups registered earlier
// (a pool's) run.
func launchGateway(t *testing.T, s *framework.Stack, args ...string) string {
	t.Helper()
	url, _ := launchGatewayAgent(t, s, args...)
	return url
}

// launchGatewayAgent is launchGateway, with the gateway's process.
func launchGatewayAgent(t *testing.T, s *framework.Stack, args ...string) (string, *agent) {
	t.Helper()
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	tokenKey := filepath.Join(t.TempDir(), "token-key")
	if err := os.WriteFile(tokenKey, []byte(rand.String(32)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := launchAgent(t, buildBinary(t, s.Root, "sandman-gateway"), append([]string{"--kubeconfig", s.Env["KUBECONFIG"], "--listen", addr, "--token-key-file", tokenKey,
		// Not the default port, which `make run`'s gateway holds.
		"--metrics-listen", "127.0.0.1:" + strconv.Itoa(freePort(t))}, args...))
	t.Cleanup(func() { a.stop(t) })
	url := "http://" + addr
	framework.Eventually(t, 30*time.Second, "sandman-gateway to serve", func(ctx context.Context) (bool, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url+"/healthz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, nil
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK, nil
	})
	return url, a
}

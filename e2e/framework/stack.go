package framework

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	containerd "github.com/containerd/containerd/v2/client"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// DefaultStateDir is where hack/local-up.sh keeps the stack unless
// SANDMAN_STATE says otherwise.
const DefaultStateDir = "/var/lib/sandman-local"

// Stack is a running local stack, as described by its stack.env file.
type Stack struct {
	// Env is stack.env as written by hack/local-up.sh.
	Env map[string]string
	// Root is the repository's root directory.
	Root string

	RESTConfig *rest.Config
	Kube       kubernetes.Interface

	ContainerdAddress string
	Registry          string
	CNIConfDir        string
	CNIBinDir         string
	// RuncBin is the pinned runc sandboxes run under (RUNC_BIN; for a
	// stack started before stack.env had it, hack/build-tools.sh's cache
	// path of the version hack/lib.sh pins).
	RuncBin string
	// RunscBin is the pinned gVisor runsc (RUNSC_BIN, or the cache path
	// as for RuncBin).
	RunscBin string

	BusyboxImage string
	NoShellImage string
	DebianImage  string
	// E2BBaseImage is DebianImage's layer as E2B's base template: default
	// user `user` with a home and passwordless sudo.
	E2BBaseImage string
}

// the stack for this test binary, set by Main.
var (
	current  *Stack
	startErr error
)

// Main is TestMain for packages that need the stack. Tests are run only as
// root; otherwise every test that calls Get skips. When the stack is not
// running, Main starts it and stops it after the tests.
func Main(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Geteuid() != 0 {
		startErr = errors.New("the local stack needs root (containerd, network namespaces)")
		return m.Run()
	}
	root, err := repoRoot()
	if err != nil {
		startErr = err
		return m.Run()
	}
	started := false
	if err := StackUp(root); err != nil {
		fmt.Fprintf(os.Stderr, "framework: %v; starting it\n", err)
		if err := script(root, "local-up.sh"); err != nil {
			startErr = fmt.Errorf("hack/local-up.sh: %w", err)
		}
		started = true
	}
	if startErr == nil {
		current, startErr = Load(root)
	}
	var before *Census
	if startErr == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		before, startErr = TakeCensus(ctx, current.ContainerdAddress)
		cancel()
	}
	code := m.Run()
	if before != nil && startErr == nil && code == 0 {
		if leaks := settle(before, current.ContainerdAddress); len(leaks) > 0 {
			fmt.Fprintf(os.Stderr, "framework: the tests left %d things behind (each test must release what it bound):\n  %s\n", len(leaks), strings.Join(leaks, "\n  "))
			code = 1
		} else {
			fmt.Fprintln(os.Stderr, "framework: census clean: no container, task, mount or shim left by the tests")
		}
	}
	if started && os.Getenv("SANDMAN_KEEP_STACK") == "" {
		if err := script(root, "local-down.sh"); err != nil {
			fmt.Fprintf(os.Stderr, "framework: hack/local-down.sh: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// settle takes censuses until nothing is left over from before (the
// kubelet and containerd finish deletions in the background) or 90 s
// pass, and returns what is still left.
func settle(before *Census, address string) []string {
	var leaks []string
	deadline := time.Now().Add(90 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		after, err := TakeCensus(ctx, address)
		cancel()
		if err != nil {
			leaks = []string{"census: " + err.Error()}
		} else if leaks = before.Leaks(after); len(leaks) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return leaks
		}
		time.Sleep(time.Second)
	}
}

// Get returns the stack for a test, skipping when the test is not root and
// failing when the stack could not be started.
func Get(t testing.TB) *Stack {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("skipping: needs root for the local stack (containerd, network namespaces)")
	}
	if startErr != nil {
		t.Fatalf("local stack: %v", startErr)
	}
	if current == nil {
		t.Fatal("local stack: framework.Main was not used as TestMain")
	}
	return current
}

// StateDir is the stack's state directory.
func StateDir() string {
	if d := os.Getenv("SANDMAN_STATE"); d != "" {
		return d
	}
	return DefaultStateDir
}

// Load reads stack.env and makes the stack's clients; root is the
// repository's root directory. It does not start anything and needs no
// test: Main uses it for the tests, hack/bench for the benchmarks.
func Load(root string) (*Stack, error) {
	env, err := readEnv(filepath.Join(StateDir(), "stack.env"))
	if err != nil {
		return nil, fmt.Errorf("the local stack is not up (%v): run make local-up", err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", env["KUBECONFIG"])
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", env["KUBECONFIG"], err)
	}
	cfg.QPS, cfg.Burst = 200, 400
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	return &Stack{
		Env:               env,
		Root:              root,
		RESTConfig:        cfg,
		Kube:              kube,
		ContainerdAddress: env["CONTAINERD_ADDRESS"],
		Registry:          env["REGISTRY"],
		CNIConfDir:        env["CNI_CONF_DIR"],
		CNIBinDir:         env["CNI_BIN_DIR"],
		RuncBin:           cachedBin(env, root, "RUNC_BIN", "RUNC_VERSION", "runc", "runc"),
		RunscBin:          cachedBin(env, root, "RUNSC_BIN", "GVISOR_VERSION", "gvisor", "runsc"),
		BusyboxImage:      env["BUSYBOX_IMAGE"],
		NoShellImage:      env["NOSHELL_IMAGE"],
		DebianImage:       env["DEBIAN_IMAGE"],
		E2BBaseImage:      env["E2B_BASE_IMAGE"],
	}, nil
}

// Containerd connects to the stack's containerd in namespace ns; the client is
// closed when the test ends.
func (s *Stack) Containerd(t testing.TB, ns string) *containerd.Client {
	t.Helper()
	c, err := s.NewContainerd(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// NewContainerd connects to the stack's containerd in namespace ns; the
// caller closes the client.
func (s *Stack) NewContainerd(ns string) (*containerd.Client, error) {
	c, err := containerd.New(s.ContainerdAddress, containerd.WithDefaultNamespace(ns),
		containerd.WithTimeout(10*time.Second))
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w", s.ContainerdAddress, err)
	}
	return c, nil
}

// StackUp reports whether the local stack is up, by the rule hack/lib.sh's
// stack_up defines for every tier and make bench (stack.env written, the
// recorded kube-apiserver and containerd running): it runs that function,
// so the rule has one definition. nil means up.
func StackUp(root string) error {
	cmd := exec.Command("bash", "-c", `source "$1" && stack_up`, "bash", filepath.Join(root, "hack", "lib.sh"))
	cmd.Stderr = os.Stderr
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return fmt.Errorf("local stack not up in %s (hack/lib.sh stack_up: no stack.env, or its kube-apiserver or containerd not running)", StateDir())
	}
	if err != nil {
		return fmt.Errorf("hack/lib.sh stack_up: %w", err)
	}
	return nil
}

func script(root, name string) error {
	cmd := exec.Command("bash", filepath.Join(root, "hack", name))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	return cmd.Run()
}

// cachedBin is key from stack.env, or where hack/build-tools.sh caches the
// binary of the version hack/lib.sh pins
// ($SANDMAN_CACHE/<dir>-$<versionKey>/<name>), for a stack started before
// stack.env had key.
func cachedBin(env map[string]string, root, key, versionKey, dir, name string) string {
	if p := env[key]; p != "" {
		return p
	}
	b, err := os.ReadFile(filepath.Join(root, "hack", "lib.sh"))
	if err != nil {
		return ""
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, versionKey+"="); ok {
			cache := os.Getenv("SANDMAN_CACHE")
			if cache == "" {
				cache = "/var/cache/sandman"
			}
			return filepath.Join(cache, dir+"-"+strings.TrimSpace(v), name)
		}
	}
	return ""
}

func readEnv(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if ok && !strings.HasPrefix(k, "#") {
			env[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return env, sc.Err()
}

// repoRoot walks up from the working directory to the sandman module root.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "hack", "local-up.sh")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the repository root (hack/local-up.sh) above the working directory")
		}
		dir = parent
	}
}

// NamespaceReady waits until kube-controller-manager has made namespace
// ns's default ServiceAccount: pods are admitted only then (it takes
// seconds after an apiserver outage, while the controller's informers back
// off).
func (s *Stack) NamespaceReady(t testing.TB, ns string) {
	t.Helper()
	Eventually(t, 2*time.Minute, "namespace "+ns+" to have its default ServiceAccount", func(ctx context.Context) (bool, error) {
		_, err := s.Kube.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil, nil
	})
}

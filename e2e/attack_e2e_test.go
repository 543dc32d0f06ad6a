//go:build e2e

package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime"
)

// attackScript runs inside a sandbox as root and tries, one by one, what
// hostile code would. It prints one JSON object per attempt:
// {"attack": ..., "succeeded": bool, "detail": ...}. Arguments: the
// host:port targets to connect to, and --no-pid1-signals to leave PID 1's
// signals out (gVisor lets them through: see TestGVisorSandboxes).
const attackScript = `
import ctypes, json, os, signal, socket, sys

def report(attack, succeeded, detail=""):
    print(json.dumps({"attack": attack, "succeeded": succeeded, "detail": str(detail)[:300]}), flush=True)

def attempt(attack, fn):
    try:
        report(attack, True, fn())
    except Exception as e:
        report(attack, False, repr(e))

signals = "--no-pid1-signals" not in sys.argv
for target in [a for a in sys.argv[1:] if not a.startswith("--")]:
    host, port = target.rsplit(":", 1)
    attempt("connect " + target, lambda: socket.create_connection((host, int(port)), timeout=3).close())

# Signals to PID 1 (SIGTERM ends a sandbox by design: not sent).
if signals:
    for sig in ("SIGKILL", "SIGHUP", "SIGINT", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGABRT", "SIGSTOP", "SIGSEGV", "SIGPIPE", "SIGALRM"):
        try:
            os.kill(1, getattr(signal, sig))
        except Exception as e:
            pass
    pid1 = open("/proc/1/cmdline", "rb").read().split(b"\0")[0].decode()
    report("kill or replace PID 1 with signals", not pid1.endswith("/sandman-daemon"), pid1)

libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
rc = libc.ptrace(16, 1, None, None)  # PTRACE_ATTACH
report("ptrace PID 1", rc == 0, "errno %d" % ctypes.get_errno())
if rc == 0:
    libc.ptrace(17, 1, None, None)

def bind_daemon_port():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", 49983))
    s.listen()
    return "bound"
attempt("bind :49983 in the daemon's place", bind_daemon_port)

for f in ("/proc/1/environ", "/proc/1/mem", "/proc/1/maps", "/proc/1/fd/0"):
    attempt("read " + f, lambda f=f: open(f, "rb").read(16))
cmdline = open("/proc/1/cmdline", "rb").read().decode(errors="replace")
import re
report("token hash in /proc/1/cmdline", re.search(r"[0-9a-f]{64}", cmdline) is not None, cmdline.replace("\0", " "))

pids = [p for p in os.listdir("/proc") if p.isdigit()]
def cmdline_of(p):
    try:
        return open("/proc/%s/cmdline" % p, "rb").read().decode(errors="replace")
    except Exception:
        return ""
report("see other sandboxes' processes", any("http.server" in cmdline_of(p) for p in pids if int(p) != os.getpid()), "%d pids" % len(pids))

libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
rc = libc.mount(b"none", b"/mnt", b"tmpfs", 0, None)
report("mount a tmpfs", rc == 0, "errno %d" % ctypes.get_errno())
rc = libc.mount(b"cgroup", b"/mnt", b"cgroup", 0, b"rdma")
report("mount cgroup v1 (release_agent)", rc == 0, "errno %d" % ctypes.get_errno())

def write_cgroup():
    for root, dirs, files in os.walk("/sys/fs/cgroup"):
        for f in files:
            if f in ("release_agent", "notify_on_release", "cgroup.procs", "memory.limit_in_bytes", "pids.max", "memory.max"):
                open(os.path.join(root, f), "w").write("1")
                return os.path.join(root, f)
    raise Exception("no cgroup file visible")
attempt("write a cgroup file", write_cgroup)
attempt("mknod a block device", lambda: os.mknod("/tmp/sda", 0o600 | 0o060000, os.makedev(8, 0)))
attempt("open the host's disk", lambda: open("/dev/sda", "rb").read(1))
attempt("raw socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
attempt("unshare a user namespace and mount", lambda: (libc.unshare(0x10000000 | 0x00020000) == 0 and libc.mount(b"none", b"/mnt", b"tmpfs", 0, None) == 0) or (_ for _ in ()).throw(Exception("errno %d" % ctypes.get_errno())))
`

// TestAttackSuite: hostile code in a sandbox tries what an attacker would
// — reach other sandboxes, the node and the cluster, kill or replace PID 1,
// read token material, mount, write cgroups, make devices, exhaust memory
// and processes — and every attempt fails; afterwards the attacker's own
// daemon, its neighbour and the node agent still serve. Pods asking for
// what a sandbox cannot run safely are refused by name. An image or pod
// environment cannot turn the daemon's authentication off.
func TestAttackSuite(t *testing.T) {
	s := framework.Get(t)
	p := startPool(t, s, 1, 4)
	ctx := t.Context()
	backdoor := sha256.Sum256([]byte("backdoor"))
	p.create(p.newPod("victim", s.DebianImage, func(pod *corev1.Pod) {
		pod.Spec.Containers[0].Command = []string{"python3", "-m", "http.server", "8080"}
		pod.Spec.Containers[0].Args = nil
		pod.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8080}}
	}))
	p.create(p.newPod("attacker", s.DebianImage, func(pod *corev1.Pod) {
		// A pod that tries to turn the daemon's authentication off and to
		// add a token of its own through the environment.
		pod.Spec.Containers[0].Env = []corev1.EnvVar{
			{Name: "SANDMAN_ALLOW_UNAUTHENTICATED", Value: "1"},
			{Name: "SANDMAN_TOKEN_SHA256", Value: hex.EncodeToString(backdoor[:])},
		}
		pod.Spec.Containers[0].Resources.Limits = corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("256Mi")}
	}))
	victim := p.waitPod("victim", 3*time.Minute, "Ready", podReady)
	attacker := p.waitPod("attacker", 3*time.Minute, "Ready", podReady)
	a := daemonAt(t, attacker.Status.PodIP, trainerToken)

	// The environment is not the daemon's settings.
	for name, tok := range map[string]string{"no token": "", "the pod's backdoor token": "backdoor"} {
		c, _ := client.New(attacker.Status.PodIP+":49983", client.WithToken(tok), client.WithRetries(0))
		if _, err := c.Exec(ctx, api.ExecRequest{Cmd: []string{"true"}}); !client.IsCode(err, api.CodeUnauthorized) {
			t.Errorf("exec with %s on a pod that set SANDMAN_* env: %v, want unauthorized", name, err)
		}
	}

	runAttacks(t, s, p, a, victim, true)

	// PID 1 drops the signals it is sent, but commands keep the default
	// dispositions of the standard signals 1-31 (an ignored one would pass
	// to them through exec). Real-time signals 32 and 33 belong to the C
	// library's and Go's runtimes, not to shells.
	r, err := a.Exec(ctx, api.ExecRequest{Shell: "grep SigIgn /proc/self/status"})
	if err != nil {
		t.Fatal(err)
	}
	ign, perr := strconv.ParseUint(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(r.Stdout)), "SigIgn:")), 16, 64)
	if perr != nil || ign&0x7fffffff != 0 {
		t.Errorf("a command's ignored signals: %q (%v), want none of 1-31", r.Stdout, perr)
	}

	// Exhaustion: memory past the limit and a fork bomb end processes,
	// not the sandbox.
	if r, err := a.Exec(ctx, api.ExecRequest{Cmd: []string{"python3", "-c", "x = []\nwhile True: x.append(bytearray(16 << 20))"}, TimeoutSeconds: 60}); err != nil || r.ExitCode == 0 {
		t.Errorf("memory bomb: %+v %v, want killed", r, err)
	}
	if _, err := a.Exec(ctx, api.ExecRequest{Shell: "b() { b | b & }; b", TimeoutSeconds: 10}); err != nil {
		t.Logf("fork bomb exec: %v", err)
	}

	// Afterwards: the attacker's daemon (PID 1) still serves, the victim
	// still serves its owner, and the agent still binds.
	// Each try has a deadline of its own, so one request that hangs does
	// not take the whole wait; a failure says what the last try saw.
	var last string
	err = wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		r, err := a.Exec(tctx, api.ExecRequest{Cmd: []string{"cat", "/proc/1/comm"}})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		last = fmt.Sprintf("exit %d, stdout %q, stderr %q", r.ExitCode, r.Stdout, r.Stderr)
		return strings.TrimSpace(string(r.Stdout)) == "sandman-daemon", nil
	})
	if err != nil {
		pod, perr := s.Kube.CoreV1().Pods(p.ns).Get(context.Background(), "attacker", metav1.GetOptions{})
		state := fmt.Sprint(perr)
		if perr == nil {
			state = fmt.Sprintf("phase %s, containers %+v", pod.Status.Phase, pod.Status.ContainerStatuses)
		}
		t.Fatalf("waiting 1m for the attacker's daemon to serve after the attacks: %v; the last try: %s; the pod: %s", err, last, state)
	}
	if r, err := daemonAt(t, victim.Status.PodIP, trainerToken).Exec(ctx, api.ExecRequest{Cmd: []string{"true"}}); err != nil || r.ExitCode != 0 {
		t.Errorf("the victim after the attacks: %v", err)
	}
	p.create(p.newPod("after", s.BusyboxImage))
	p.waitPod("after", 2*time.Minute, "a new sandbox Ready after the attacks", podReady)

	// What a sandbox cannot run safely is refused, by name.
	for name, mutate := range map[string]func(*corev1.Pod){
		"privileged": func(pod *corev1.Pod) {
			pod.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		},
		"hostpath": func(pod *corev1.Pod) {
			pod.Spec.Volumes = []corev1.Volume{{Name: "root", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}}
		},
	} {
		p.create(p.newPod(name, s.BusyboxImage, mutate))
		pod := p.waitPod(name, time.Minute, "refused", func(pod *corev1.Pod) bool { return pod.Status.Phase == corev1.PodFailed })
		if pod.Status.Reason != runtime.ReasonInvalidSpec || !strings.Contains(pod.Status.Message, map[string]string{"privileged": "privileged", "hostpath": "hostPath"}[name]) {
			t.Errorf("%s pod: %s %q, want InvalidSpec naming the field", name, pod.Status.Reason, pod.Status.Message)
		}
	}
}

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}

// kubeServer is the apiserver URL of the stack's kubeconfig.
func kubeServer(t *testing.T, s *framework.Stack) string {
	t.Helper()
	out, _, code := kubectl(t, s, "", "config", "view", "--minify", "-o", "jsonpath={.clusters[0].cluster.server}")
	if code != 0 || out == "" {
		t.Fatalf("kubectl config view: %d %q", code, out)
	}
	return strings.TrimSpace(out)
}

// runAttacks runs attackScript in the sandbox a serves, against the other
// sandbox victim (its daemon and server), the node's addresses (SSH, the
// kubelet, the apiserver, the registry, the virtual node's kubelet port,
// the agent), the apiserver's service address and metadata, and against
// the attacker's own daemon on loopback, which must work (the probe
// itself is sound). Every other attempt must fail. pid1Signals: PID 1 is
// sent the signals that must not end it.
func runAttacks(t *testing.T, s *framework.Stack, p *vpool, a *client.Client, victim *corev1.Pod, pid1Signals bool) {
	t.Helper()
	ctx := t.Context()
	primary := primaryAddr(t)
	u, _ := url.Parse(kubeServer(t, s))
	_, apiPort, _ := net.SplitHostPort(u.Host)
	svc, err := s.Kube.CoreV1().Services("default").Get(ctx, "kubernetes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, agentPort, _ := net.SplitHostPort(p.agents[0].addr)
	_, vkPort, _ := net.SplitHostPort(p.vkArgs[indexOf(p.vkArgs, "--kubelet-listen")+1])
	targets := []string{victim.Status.PodIP + ":49983", victim.Status.PodIP + ":8080", "169.254.169.254:80",
		svc.Spec.ClusterIP + ":443"}
	for _, host := range []string{s.Env["BRIDGE_IP"], primary} {
		for _, port := range []string{"22", "10250", apiPort, "15000", vkPort, agentPort} {
			targets = append(targets, host+":"+port)
		}
	}
	args := append([]string{"python3", "-c", attackScript}, append(targets, "127.0.0.1:49983")...)
	want := len(targets) + 15
	if !pid1Signals {
		args, want = append(args, "--no-pid1-signals"), want-1
	}
	res, err := a.Exec(ctx, api.ExecRequest{Cmd: args, TimeoutSeconds: 120})
	if err != nil {
		t.Fatalf("run the attacks: %v", err)
	}
	attacks := 0
	for line := range strings.SplitSeq(strings.TrimSpace(string(res.Stdout)), "\n") {
		var r struct {
			Attack    string `json:"attack"`
			Succeeded bool   `json:"succeeded"`
			Detail    string `json:"detail"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("attack output %q: %v\nstderr: %s", line, err, res.Stderr)
		}
		attacks++
		// The one connection that must work: the sandbox's own daemon, so
		// that a refused connection means the firewall, not the probe.
		wantSucceeded := r.Attack == "connect 127.0.0.1:49983"
		if r.Succeeded != wantSucceeded {
			t.Errorf("attack %q: succeeded=%v (%s)", r.Attack, r.Succeeded, r.Detail)
		} else {
			t.Logf("attack %q: succeeded=%v (%s)", r.Attack, r.Succeeded, r.Detail)
		}
	}
	if attacks < want {
		t.Fatalf("only %d attack results; stderr: %s", attacks, res.Stderr)
	}
}

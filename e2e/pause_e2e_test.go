//go:build e2e

package e2e

import (
	"bufio"
	"context"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
)

// statefulServer64 holds 64 MiB of random bytes and answers each
// connection on port 8080 with their digest, its pid and how many
// connections it took.
const statefulServer64 = `
import hashlib, os, socket
data = bytearray(os.urandom(64 << 20))
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080))
s.listen(16)
n = 0
while True:
    c, _ = s.accept()
    n += 1
    c.sendall(("%s %d %d\n" % (hashlib.sha256(data).hexdigest(), os.getpid(), n)).encode())
    c.close()
`

// TestPauseResume: a gVisor sandbox with a process holding 64 MiB and
// listening on a port is paused with sandmanctl — the pod says Paused in
// kubectl and sandmanctl, is not Ready, its worker shows a paused slot and
// its port is closed — and resumed by removing the pod's annotation: the
// same process answers with the same memory, kubectl exec works. A runc
// sandbox's pause is refused on its pod, naming CRIU, and it keeps
// running. A paused pod that is deleted leaves nothing behind (the census).
func TestPauseResume(t *testing.T) {
	s := framework.Get(t)
	needRunsc(t, s)
	ensureRuntimeClass(t, s, "gvisor", runtime.RuntimeHandlerRunsc)
	p := startPool(t, s, 1, 3)
	bin := buildBinary(t, s.Root, "sandmanctl")
	tokens := t.TempDir()
	ctl := func(args ...string) (string, string, int) {
		return sandmanctl(t, s, bin, tokens, append([]string{"-n", p.ns}, args...)...)
	}
	ctx := t.Context()
	p.create(p.newPod("keeper", s.DebianImage, func(pod *corev1.Pod) {
		pod.Spec.RuntimeClassName = ptr.To("gvisor")
		pod.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8080}}
	}))
	p.create(p.newPod("plain", s.BusyboxImage))
	keeper := p.waitPod("keeper", 3*time.Minute, "Ready", podReady)
	p.waitPod("plain", 3*time.Minute, "Ready", podReady)
	ip := keeper.Status.PodIP
	ask := func() (string, error) {
		c, err := net.DialTimeout("tcp", ip+":8080", 5*time.Second)
		if err != nil {
			return "", err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		return bufio.NewReader(c).ReadString('\n')
	}
	if _, err := daemonAt(t, ip, trainerToken).StartProcess(ctx, api.ProcessRequest{Cmd: []string{"python3", "-c", statefulServer64}}); err != nil {
		t.Fatal(err)
	}
	var before string
	framework.Eventually(t, 2*time.Minute, "the stateful server", func(ctx context.Context) (bool, error) {
		var err error
		before, err = ask()
		return err == nil, nil
	})

	out, errOut, code := ctl("pause", "keeper")
	if code != 0 || !strings.Contains(out, "keeper paused") {
		t.Fatalf("sandmanctl pause keeper: %d %q %q", code, out, errOut)
	}
	t.Logf("sandmanctl pause: %s", strings.TrimSpace(out))
	paused := p.waitPod("keeper", time.Minute, "paused", func(pod *corev1.Pod) bool { return pod.Status.Reason == podcontract.ReasonPaused })
	if podReady(paused) || paused.Status.Phase != corev1.PodRunning {
		t.Errorf("paused pod: ready %v, phase %s", podReady(paused), paused.Status.Phase)
	}
	if out, _, _ := kubectl(t, s, "", "-n", p.ns, "get", "pod", "keeper", "--no-headers"); !strings.Contains(out, "Paused") || !strings.Contains(out, "0/1") {
		t.Errorf("kubectl get pod keeper: %q, want 0/1 Paused", out)
	}
	if out, _, _ := ctl("get", "keeper"); !strings.Contains(out, "Paused") {
		t.Errorf("sandmanctl get keeper: %q, want Paused", out)
	}
	if out, _, code := ctl("top", "nodes", "--pool", p.name); code != 0 || !strings.Contains(out, "PAUSED") {
		t.Errorf("sandmanctl top nodes: %d %q", code, out)
	} else {
		lines := strings.Split(out, "\n")
		head, row := strings.Fields(lines[0]), strings.Fields(lines[1])
		for i, h := range head {
			if h == "PAUSED" && (i >= len(row) || row[i] != "1") {
				t.Errorf("sandmanctl top nodes: the worker's PAUSED column is not 1:\n%s", out)
			}
		}
	}
	if _, err := ask(); err == nil {
		t.Errorf("the paused sandbox's port answers")
	}

	// Resumed from the pod, as a trainer without the CLI would.
	begin := time.Now()
	if out, errOut, code := kubectl(t, s, "", "-n", p.ns, "annotate", "pod", "keeper", podcontract.AnnotationPause+"-"); code != 0 {
		t.Fatalf("kubectl annotate: %d %q %q", code, out, errOut)
	}
	p.waitPod("keeper", time.Minute, "resumed and Ready", func(pod *corev1.Pod) bool {
		for _, c := range pod.Status.Conditions {
			if c.Type == podcontract.ConditionPaused {
				return c.Reason == podcontract.ReasonResumed && podReady(pod)
			}
		}
		return false
	})
	after, err := ask()
	if err != nil {
		t.Fatalf("the resumed server: %v", err)
	}
	t.Logf("annotation removed → Ready and first answer: %v", time.Since(begin).Round(time.Millisecond))
	b, a := strings.Fields(before), strings.Fields(after)
	if len(a) != 3 || len(b) != 3 || a[0] != b[0] || a[1] != b[1] || a[2] != "2" {
		t.Fatalf("before the pause the server said %q, after %q: want the same digest and pid, connection 2", before, after)
	}
	if out, errOut, code := kubectl(t, s, "", "-n", p.ns, "exec", "keeper", "--", "echo", "back"); code != 0 || out != "back\n" {
		t.Errorf("kubectl exec after the resume: %d %q %q", code, out, errOut)
	}

	// runc cannot keep a sandbox's processes: refused, and it runs on.
	if _, errOut, code := ctl("pause", "plain"); code == 0 || !strings.Contains(errOut, "CRIU") {
		t.Errorf("sandmanctl pause plain: %d %q, want a refusal naming CRIU", code, errOut)
	}
	p.waitPod("plain", time.Minute, "Ready after its refused pause", podReady)

	// A paused pod deleted: its sandbox and checkpoint go (the census at
	// the end checks the worker).
	if out, errOut, code := ctl("pause", "keeper"); code != 0 {
		t.Fatalf("second pause: %d %q %q", code, out, errOut)
	}
	if out, errOut, code := ctl("delete", "keeper"); code != 0 {
		t.Fatalf("delete the paused pod: %d %q %q", code, out, errOut)
	}
	framework.Eventually(t, time.Minute, "the paused pod's slot released", func(ctx context.Context) (bool, error) {
		b, err := p.boundSlots(ctx)
		return err == nil && len(b) == 1, nil
	})
}

// TestAutoPause: on a pool that pauses idle gVisor sandboxes
// (--auto-pause-after), a sandbox whose main process holds memory and
// serves a port is paused once nobody calls its daemon (its pod says
// sandman.io/pause=idle, Paused), and the next kubectl exec resumes it
// transparently: the exec answers, the process answers with the same
// memory, and the pod runs again.
func TestAutoPause(t *testing.T) {
	s := framework.Get(t)
	needRunsc(t, s)
	ensureRuntimeClass(t, s, "gvisor", runtime.RuntimeHandlerRunsc)
	p := startPoolWith(t, s, poolOptions{agents: 1, slots: 2,
		vkArgs: func(*vpool) []string { return []string{"--auto-pause-after", "3s", "--reconcile-interval", "1s"} }})
	p.create(p.newPod("napper", s.DebianImage, func(pod *corev1.Pod) {
		pod.Spec.RuntimeClassName = ptr.To("gvisor")
		pod.Spec.Containers[0].Command = []string{"python3", "-c", statefulServer64}
		pod.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8080}}
	}))
	napper := p.waitPod("napper", 3*time.Minute, "Ready", podReady)
	ask := func() (string, error) {
		c, err := net.DialTimeout("tcp", napper.Status.PodIP+":8080", 5*time.Second)
		if err != nil {
			return "", err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(30 * time.Second))
		return bufio.NewReader(c).ReadString('\n')
	}
	var before string
	framework.Eventually(t, 2*time.Minute, "the stateful server", func(ctx context.Context) (bool, error) {
		var err error
		before, err = ask()
		return err == nil, nil
	})
	p.waitPod("napper", time.Minute, "paused after sitting idle", func(pod *corev1.Pod) bool {
		return pod.Annotations[podcontract.AnnotationPause] == podcontract.PauseIdle && pod.Status.Reason == podcontract.ReasonPaused
	})
	begin := time.Now()
	out, errOut, code := kubectl(t, s, "", "-n", p.ns, "exec", "napper", "--", "echo", "awake")
	if code != 0 || out != "awake\n" {
		t.Fatalf("kubectl exec of the paused sandbox: %d %q %q", code, out, errOut)
	}
	t.Logf("kubectl exec of an idle-paused sandbox answered in %v", time.Since(begin).Round(time.Millisecond))
	after, err := ask()
	if err != nil {
		t.Fatalf("the resumed server: %v", err)
	}
	b, a := strings.Fields(before), strings.Fields(after)
	if len(a) != 3 || len(b) != 3 || a[0] != b[0] || a[1] != b[1] {
		t.Fatalf("before the pause the server said %q, after %q: want the same digest and pid", before, after)
	}
	p.waitPod("napper", time.Minute, "running, its annotation gone", func(pod *corev1.Pod) bool {
		_, has := pod.Annotations[podcontract.AnnotationPause]
		return !has && podReady(pod)
	})
}

// forkingServer holds 16 MiB of random bytes, counts while it waits for
// connections (mid-computation), and answers each connection on port 8080
// with the bytes' digest, its pid, how many connections it took and its
// count.
const forkingServer = `
import hashlib, os, socket
data = bytearray(os.urandom(16 << 20))
ticks = 0
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 8080))
s.listen(16)
s.settimeout(0.01)
n = 0
while True:
    try:
        c, _ = s.accept()
    except socket.timeout:
        ticks += 1
        continue
    n += 1
    c.settimeout(None)
    c.sendall(("%s %d %d %d\n" % (hashlib.sha256(data).hexdigest(), os.getpid(), n, ticks)).encode())
    c.close()
`

// TestFork: sandmanctl forks a gVisor sandbox that is counting mid-way into
// 8 sandboxes. Each is a new pod on its own address with its own token
// (the source's is refused), and goes on from the same moment: the same
// process with the same memory, its count past the source's at the fork.
// They then diverge: a file written in one fork is in no other and not in
// the source, and the source runs on. A fork of a runc sandbox fails its
// pod naming CRIU; deleting everything leaves nothing (the census).
func TestFork(t *testing.T) {
	s := framework.Get(t)
	needRunsc(t, s)
	ensureRuntimeClass(t, s, "gvisor", runtime.RuntimeHandlerRunsc)
	p := startPool(t, s, 1, 11)
	bin := buildBinary(t, s.Root, "sandmanctl")
	tokens := t.TempDir()
	ctl := func(args ...string) (string, string, int) {
		return sandmanctl(t, s, bin, tokens, append([]string{"-n", p.ns}, args...)...)
	}
	ctx := t.Context()
	p.create(p.newPod("origin", s.DebianImage, func(pod *corev1.Pod) {
		pod.Spec.RuntimeClassName = ptr.To("gvisor")
		pod.Spec.Containers[0].Command = []string{"python3", "-c", forkingServer}
		pod.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8080}}
	}))
	p.create(p.newPod("plain", s.BusyboxImage))
	origin := p.waitPod("origin", 3*time.Minute, "Ready", podReady)
	p.waitPod("plain", 3*time.Minute, "Ready", podReady)
	ask := func(ip string) []string { return askServer(t, ip) }
	src := daemonAt(t, origin.Status.PodIP, trainerToken)
	framework.Eventually(t, 2*time.Minute, "the counting server", func(ctx context.Context) (bool, error) {
		c, err := net.DialTimeout("tcp", origin.Status.PodIP+":8080", time.Second)
		if err == nil {
			c.Close()
			return true, nil
		}
		return false, nil
	})
	if _, err := src.Exec(ctx, api.ExecRequest{Shell: "echo before > /root/note"}); err != nil {
		t.Fatal(err)
	}
	before := ask(origin.Status.PodIP) // connection 2
	ticksBefore, _ := strconv.Atoi(before[3])

	out, errOut, code := ctl("fork", "origin", "--count", "8")
	if code != 0 {
		t.Fatalf("sandmanctl fork origin --count 8: %d %q %q", code, out, errOut)
	}
	t.Logf("sandmanctl fork: %s", strings.TrimSpace(errOut))
	type fork struct{ name, ip, token string }
	var forks []fork
	for line := range strings.SplitSeq(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			t.Fatalf("sandmanctl fork printed %q", line)
		}
		tok, err := os.ReadFile(f[1])
		if err != nil {
			t.Fatal(err)
		}
		pod := p.waitPod(f[0], time.Minute, "Ready", podReady)
		forks = append(forks, fork{f[0], pod.Status.PodIP, strings.TrimSpace(string(tok))})
	}
	if len(forks) != 8 {
		t.Fatalf("sandmanctl fork made %d sandboxes: %q", len(forks), out)
	}
	ips := map[string]bool{origin.Status.PodIP: true}
	for _, f := range forks {
		if ips[f.ip] {
			t.Errorf("fork %s's address %s is taken", f.name, f.ip)
		}
		ips[f.ip] = true
		got := ask(f.ip)
		ticks, _ := strconv.Atoi(got[3])
		if got[0] != before[0] || got[1] != before[1] || got[2] != "3" || ticks < ticksBefore {
			t.Errorf("fork %s's server said %q, the source's before the fork %q: want the same digest and pid, connection 3, a count from %d on", f.name, got, before, ticksBefore)
		}
		d := daemonAt(t, f.ip, f.token)
		if res, err := d.Exec(ctx, api.ExecRequest{Cmd: []string{"cat", "/root/note"}}); err != nil || string(res.Stdout) != "before\n" {
			t.Errorf("fork %s's /root/note: %v %q", f.name, err, res.Stdout)
		}
		if _, err := daemonAt(t, f.ip, trainerToken).Exec(ctx, api.ExecRequest{Cmd: []string{"true"}}); err == nil {
			t.Errorf("fork %s takes its source's token", f.name)
		}
	}
	// They diverge.
	if _, err := daemonAt(t, forks[0].ip, forks[0].token).Exec(ctx, api.ExecRequest{Shell: "echo mine > /root/only-0"}); err != nil {
		t.Fatal(err)
	}
	for _, f := range forks[1:] {
		res, err := daemonAt(t, f.ip, f.token).Exec(ctx, api.ExecRequest{Shell: "test -e /root/only-0 && echo seen || echo unseen"})
		if err != nil || string(res.Stdout) != "unseen\n" {
			t.Errorf("fork %s and fork 0's file: %v %q", f.name, err, res.Stdout)
		}
	}
	if res, err := src.Exec(ctx, api.ExecRequest{Shell: "test -e /root/only-0 && echo seen || echo unseen"}); err != nil || string(res.Stdout) != "unseen\n" {
		t.Errorf("the source and fork 0's file: %v %q", err, res.Stdout)
	}
	if got := ask(origin.Status.PodIP); got[2] != "3" || got[1] != before[1] {
		t.Errorf("the source after the forks said %q, want its own connection 3", got)
	}
	if out, _, _ := kubectl(t, s, "", "-n", p.ns, "get", "events", "--field-selector", "involvedObject.name="+forks[0].name, "-o", "jsonpath={.items[*].reason}"); !strings.Contains(out, podcontract.ReasonForking) {
		t.Errorf("events of fork %s: %q, want %s", forks[0].name, out, podcontract.ReasonForking)
	}

	// runc cannot fork with its processes: the fork's pod fails saying why.
	if _, errOut, code := ctl("fork", "plain", "--wait", "1m"); code == 0 || !strings.Contains(errOut, "CRIU") {
		t.Errorf("sandmanctl fork plain: %d %q, want a failure naming CRIU", code, errOut)
	}

	for _, name := range append([]string{"origin", "plain"}, func() (n []string) {
		for _, f := range forks {
			n = append(n, f.name)
		}
		return n
	}()...) {
		if out, errOut, code := ctl("delete", name); code != 0 {
			t.Fatalf("delete %s: %d %q %q", name, code, out, errOut)
		}
	}
	framework.Eventually(t, time.Minute, "every slot released", func(ctx context.Context) (bool, error) {
		b, err := p.boundSlots(ctx)
		return err == nil && len(b) == 0, nil
	})
}

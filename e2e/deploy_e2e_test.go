//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/rand"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/daemon/envd/spec/process"
	"github.com/sandman-dev/sandman/daemon/envd/spec/process/processconnect"
	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
	"github.com/sandman-dev/sandman/vk"
	vkapi "github.com/sandman-dev/sandman/vk/api"
)

// What deploy/overlays/local installs.
const (
	deployNS         = "sandman-system"
	deployVNode      = "sandman-deployed"
	deployPool       = "deployed"
	deployCtrdNS     = "sandman-deployed"
	deployStateDir   = "/var/lib/sandman-node"
	deployPoolSlots  = 24
	deployPoolMemory = "8Gi"
	// deployPoolLabel on a namespace admits its pods to the pool
	// (--allowed-namespace-selector).
	deployPoolLabel = podcontract.PoolAccessLabelPrefix + "deployed"
)

// deployed is sandman as an operator installs it on the stack.
type deployed struct {
	t      *testing.T
	s      *framework.Stack
	worker string
	ns     string // the trainer's namespace
}

// TestDeployed installs sandman with `kubectl apply -k deploy/overlays/local`
// on the stack's real kubelet worker and uses it as trainers and operators
// do, then uninstalls it. The phases share the install, so they run in
// order in one test.
func TestDeployed(t *testing.T) {
	s := framework.Get(t)
	d := &deployed{t: t, s: s, worker: s.Env["WORKER_NAME"], ns: "trainer-" + rand.String(5)}
	if d.worker == "" {
		t.Fatal("stack.env has no WORKER_NAME: the stack has no kubelet worker (hack/local-up.sh)")
	}
	d.install()

	var box *corev1.Pod
	t.Run("TrainerJob", d.trainerJob)
	t.Run("KubectlExecLogsTop", func(t *testing.T) { box = d.kubectlExecLogsTop(t) })
	t.Run("ControlKeyRotation", d.controlKeyRotation)
	t.Run("GVisor", d.gvisor)
	t.Run("FakeAgentIgnored", d.fakeAgentIgnored)
	t.Run("NodeAPIMutualTLS", d.nodeAPIMutualTLS)
	t.Run("PoolShareReserved", d.poolShareReserved)
	t.Run("E2BGateway", d.gateway)
	t.Run("NetworkPolicy", d.networkPolicy)
	t.Run("RollingUpdateKeepsSandboxes", func(t *testing.T) { d.rollingUpdate(t, box) })
	t.Run("UnreachableContainerd", func(t *testing.T) { d.unreachableContainerd(t, box) })
	t.Run("Uninstall", d.uninstall)
}

func (d *deployed) kubectl(t *testing.T, args ...string) string {
	t.Helper()
	out, errOut, code := kubectl(t, d.s, "", args...)
	if code != 0 {
		t.Fatalf("kubectl %s: exit %d: %s%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// kubectlBackground runs kubectl outside the test's context (cleanups run
// after it ends), and returns its output and error.
func (d *deployed) kubectlBackground(timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, d.s.Env["KUBECTL"], args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+d.s.Env["KUBECONFIG"])
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (d *deployed) overlay() string { return filepath.Join(d.s.Root, "deploy", "overlays", "local") }

// install applies the overlay on a stack with no sandman process and waits
// for the DaemonSet pod and the virtual node with the worker's pool share.
func (d *deployed) install() {
	t, s := d.t, d.s
	ctx := t.Context()
	if _, err := s.Kube.CoreV1().Namespaces().Get(ctx, deployNS, metav1.GetOptions{}); err == nil {
		t.Log("an earlier install is still there: deleting it first")
		if out, err := d.kubectlBackground(4*time.Minute, "delete", "-k", d.overlay(), "--ignore-not-found", "--wait", "--timeout=3m"); err != nil {
			t.Fatalf("delete the earlier install: %v\n%s", err, out)
		}
	}
	_ = s.Kube.CoreV1().Nodes().Delete(ctx, deployVNode, metav1.DeleteOptions{})
	t.Cleanup(func() {
		ctx := context.Background()
		// Whatever a failed phase left: the install, the trainer's pods (on
		// a virtual node whose kubelet may be gone) and the node object.
		if out, err := d.kubectlBackground(4*time.Minute, "delete", "-k", d.overlay(), "--ignore-not-found", "--wait", "--timeout=3m"); err != nil {
			t.Logf("cleanup: delete the install: %v\n%s", err, out)
		}
		pods, _ := s.Kube.CoreV1().Pods(d.ns).List(ctx, metav1.ListOptions{})
		if pods != nil {
			for _, p := range pods.Items {
				_ = s.Kube.CoreV1().Pods(d.ns).Delete(ctx, p.Name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
			}
		}
		_ = s.Kube.CoreV1().Namespaces().Delete(ctx, d.ns, metav1.DeleteOptions{})
		_ = s.Kube.CoreV1().Nodes().Delete(ctx, deployVNode, metav1.DeleteOptions{})
	})

	d.kubectl(t, "apply", "-k", d.overlay())
	d.waitAgentReady(t, "", 3*time.Minute)
	framework.Eventually(t, 2*time.Minute, "virtual node "+deployVNode+" Ready with the worker's pool share", func(ctx context.Context) (bool, error) {
		n, err := s.Kube.CoreV1().Nodes().Get(ctx, deployVNode, metav1.GetOptions{})
		if err != nil || !nodeReady(n) {
			return false, nil
		}
		c := n.Status.Capacity
		owned := len(n.OwnerReferences) == 1 && n.OwnerReferences[0].Kind == "Namespace" && n.OwnerReferences[0].Name == deployNS
		// The pool share, scaled by the queue room the node advertises.
		room, _ := strconv.Atoi(n.Annotations[podcontract.AnnotationQueueRoom])
		share := resource.MustParse(deployPoolMemory)
		pods, milliCPU, mem := vk.Advertised(runtime.Capacity{Slots: deployPoolSlots,
			Resources: runtime.Resources{MilliCPU: 1000, MemoryBytes: share.Value()}}, room)
		return owned && c.Pods().Value() == pods && c.Cpu().MilliValue() == milliCPU && c.Memory().Value() == mem, nil
	})
	// The local overlay's pool admits namespaces with this label
	// (--allowed-namespace-selector).
	trainerNS := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: d.ns, Labels: map[string]string{deployPoolLabel: "true"}}}
	if _, err := s.Kube.CoreV1().Namespaces().Create(ctx, trainerNS, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	s.NamespaceReady(t, d.ns)
}

// agentPod returns the DaemonSet's pod on the worker (nil if none).
func (d *deployed) agentPod(ctx context.Context) (*corev1.Pod, error) {
	l, err := d.s.Kube.CoreV1().Pods(deployNS).List(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/name=sandman-node"})
	if err != nil {
		return nil, err
	}
	for i := range l.Items {
		p := &l.Items[i]
		// The DaemonSet's own pod (FakeAgentIgnored makes another with the label).
		if ref := metav1.GetControllerOf(p); ref == nil || ref.Kind != "DaemonSet" || ref.Name != "sandman-node" {
			continue
		}
		if p.Spec.NodeName == d.worker && p.DeletionTimestamp == nil {
			return p, nil
		}
	}
	return nil, nil
}

// waitAgentReady waits for the worker's agent pod to be Ready (with image
// when given) and the DaemonSet's rollout to be complete.
func (d *deployed) waitAgentReady(t *testing.T, image string, timeout time.Duration) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	framework.Eventually(t, timeout, "the sandman-node pod Ready on "+d.worker, func(ctx context.Context) (bool, error) {
		ds, err := d.s.Kube.AppsV1().DaemonSets(deployNS).Get(ctx, "sandman-node", metav1.GetOptions{})
		if err != nil || ds.Status.ObservedGeneration < ds.Generation || ds.Status.DesiredNumberScheduled != 1 ||
			ds.Status.UpdatedNumberScheduled != 1 || ds.Status.NumberReady != 1 {
			return false, nil
		}
		pod, err = d.agentPod(ctx)
		if err != nil || pod == nil || !podReady(pod) {
			return false, nil
		}
		return image == "" || pod.Spec.Containers[0].Image == image, nil
	})
	return pod
}

// capacity reads the virtual node's capacity snapshot through the
// apiserver's node proxy.
func (d *deployed) capacity(ctx context.Context) (*vkapi.Capacity, error) {
	b, err := d.s.Kube.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/" + deployVNode + "/proxy/sandman/v1/capacity").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	var c vkapi.Capacity
	return &c, json.Unmarshal(b, &c)
}

// waitSlotsFree waits until no slot on the worker holds a sandbox.
func (d *deployed) waitSlotsFree(t *testing.T) {
	t.Helper()
	var last string
	framework.Eventually(t, 2*time.Minute, "every slot on "+d.worker+" free again", func(ctx context.Context) (bool, error) {
		c, err := d.capacity(ctx)
		if err != nil || len(c.Nodes) != 1 {
			return false, nil
		}
		sl := c.Nodes[0].Slots
		last = fmt.Sprint(sl)
		return c.Nodes[0].Healthy && sl[runtime.StateBound]+sl[runtime.StateBinding]+sl[runtime.StateReleasing]+sl[runtime.StateBroken] == 0, nil
	})
	ctr := d.s.Containerd(t, deployCtrdNS)
	cs, err := ctr.Containers(t.Context(), "labels.\""+noderuntime.LabelPodUID+"\"")
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 0 {
		t.Fatalf("%d containers of pods left in containerd namespace %s (slots %s)", len(cs), deployCtrdNS, last)
	}
}

// trainerJob: a trainer runs as a Job on the real worker, creates 20
// sandboxes it owns, uses each at its pod IP; deleting the Job collects them.
func (d *deployed) trainerJob(t *testing.T) {
	s := d.s
	ctx := t.Context()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "trainer", Namespace: d.ns}}
	if _, err := s.Kube.CoreV1().ServiceAccounts(d.ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer", Namespace: d.ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "sandman-trainer"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "trainer", Namespace: d.ns}},
	}
	if _, err := s.Kube.RbacV1().RoleBindings(d.ns).Create(ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	fieldEnv := func(name, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: path}}}
	}
	job := &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "trainer", Namespace: d.ns},
		Spec: batchv1.JobSpec{
			BackoffLimit: ptr.To[int32](0),
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "trainer"}},
				Spec: corev1.PodSpec{
					ServiceAccountName: "trainer",
					RestartPolicy:      corev1.RestartPolicyNever,
					Containers: []corev1.Container{{
						Name:  "trainer",
						Image: s.Registry + "/sandman/e2e-trainer:dev",
						// :dev is rebuilt in place by every `make images`.
						ImagePullPolicy: corev1.PullAlways,
						Args:            []string{"-n", "20", "-image", s.BusyboxImage, "-pool", deployPool, "-timeout", "3m", "-wait-after"},
						Env:             []corev1.EnvVar{fieldEnv("POD_NAME", "metadata.name"), fieldEnv("POD_UID", "metadata.uid")},
						Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
							corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")}},
					}},
				},
			},
		},
	}
	if _, err := s.Kube.BatchV1().Jobs(d.ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	// The trainer's summary line, read through the real kubelet.
	var trainer *corev1.Pod
	var summary struct {
		Sandboxes int      `json:"sandboxes"`
		OK        int      `json:"ok"`
		Failed    []string `json:"failed"`
	}
	var logs string
	framework.Eventually(t, 4*time.Minute, "the trainer's summary", func(ctx context.Context) (bool, error) {
		l, err := s.Kube.CoreV1().Pods(d.ns).List(ctx, metav1.ListOptions{LabelSelector: "app=trainer"})
		if err != nil || len(l.Items) != 1 {
			return false, nil
		}
		trainer = &l.Items[0]
		if trainer.Status.Phase == corev1.PodFailed {
			b, _ := s.Kube.CoreV1().Pods(d.ns).GetLogs(trainer.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
			return false, fmt.Errorf("the trainer failed: %s", b)
		}
		b, err := s.Kube.CoreV1().Pods(d.ns).GetLogs(trainer.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		if err != nil {
			return false, nil
		}
		logs = string(b)
		for line := range strings.SplitSeq(logs, "\n") {
			if strings.HasPrefix(line, "{") && json.Unmarshal([]byte(line), &summary) == nil && summary.Sandboxes > 0 {
				return true, nil
			}
		}
		return false, nil
	})
	if trainer.Spec.NodeName != d.worker {
		t.Fatalf("the trainer ran on %q, not on the worker %s", trainer.Spec.NodeName, d.worker)
	}
	if summary.Sandboxes != 20 || summary.OK != 20 {
		t.Fatalf("trainer: %d sandboxes, %d ok, failed %v\n%s", summary.Sandboxes, summary.OK, summary.Failed, logs)
	}
	sel := "sandman.io/job=" + trainer.Name
	l, err := s.Kube.CoreV1().Pods(d.ns).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != 20 {
		t.Fatalf("%d sandbox pods with %s, want 20", len(l.Items), sel)
	}
	for _, p := range l.Items {
		if p.Spec.NodeName != deployVNode || p.Status.Phase != corev1.PodRunning || len(p.OwnerReferences) != 1 || p.OwnerReferences[0].UID != trainer.UID {
			t.Fatalf("sandbox %s: node %s, phase %s, owners %v", p.Name, p.Spec.NodeName, p.Status.Phase, p.OwnerReferences)
		}
	}

	// Deleting the Job deletes the trainer; the garbage collector deletes
	// the sandboxes it owns; the virtual node releases their slots.
	if err := s.Kube.BatchV1().Jobs(d.ns).Delete(ctx, "trainer", metav1.DeleteOptions{PropagationPolicy: ptr.To(metav1.DeletePropagationBackground)}); err != nil {
		t.Fatal(err)
	}
	framework.Eventually(t, 2*time.Minute, "the trainer's sandboxes garbage-collected", func(ctx context.Context) (bool, error) {
		l, err := s.Kube.CoreV1().Pods(d.ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0, nil
	})
	d.waitSlotsFree(t)
}

// sandbox creates a sandbox pod in the trainer's namespace and waits for it.
func (d *deployed) sandbox(t *testing.T, name string, command ...string) *corev1.Pod {
	t.Helper()
	return d.sandboxWith(t, name, nil, command...)
}

// sandboxWith is sandbox with the pod changed by mutate first.
func (d *deployed) sandboxWith(t *testing.T, name string, mutate func(*corev1.Pod), command ...string) *corev1.Pod {
	t.Helper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: d.ns, Annotations: map[string]string{"sandman.io/token-sha256": trainerHash()}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"sandman.io/pool": deployPool},
			Tolerations:  []corev1.Toleration{{Key: "sandman.io/pool", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Containers: []corev1.Container{{Name: "task", Image: d.s.BusyboxImage, Command: command, Resources: corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("64Mi")}}}},
		},
	}
	if mutate != nil {
		mutate(pod)
	}
	if _, err := d.s.Kube.CoreV1().Pods(d.ns).Create(t.Context(), pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var got *corev1.Pod
	framework.Eventually(t, 2*time.Minute, "sandbox "+name+" Ready", func(ctx context.Context) (bool, error) {
		p, err := d.s.Kube.CoreV1().Pods(d.ns).Get(ctx, name, metav1.GetOptions{})
		got = p
		return err == nil && podReady(p) && p.Status.PodIP != "", nil
	})
	return got
}

// answers checks a sandbox's daemon at its pod IP with the trainer's token.
func answers(ctx context.Context, pod *corev1.Pod) error {
	c, err := client.New(pod.Status.PodIP+":49983", client.WithToken(trainerToken), client.WithRetries(0))
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := c.Exec(ctx, api.ExecRequest{Cmd: []string{"hostname"}})
	if err != nil {
		return fmt.Errorf("sandbox %s at %s: %w", pod.Name, pod.Status.PodIP, err)
	}
	if res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != pod.Name {
		return fmt.Errorf("sandbox %s: hostname exit %d, %q", pod.Name, res.ExitCode, res.Stdout)
	}
	return nil
}

// kubectlExecLogsTop: exec and logs through the deployed sandman-vk; top
// through a real metrics-server for the sandbox, the virtual node and the
// real worker.
func (d *deployed) kubectlExecLogsTop(t *testing.T) *corev1.Pod {
	box := d.sandbox(t, "box", "sh", "-c", "echo started; exec sleep 3600")
	ns := []string{"-n", d.ns}
	if out := d.kubectl(t, append(ns, "exec", "box", "--", "sh", "-c", "echo hi from $(hostname)")...); out != "hi from box\n" {
		t.Fatalf("kubectl exec: %q", out)
	}
	if out := d.kubectl(t, append(ns, "logs", "box")...); out != "started\n" {
		t.Fatalf("kubectl logs: %q", out)
	}
	top := func(args ...string) func(ctx context.Context) (bool, error) {
		return func(ctx context.Context) (bool, error) {
			out, _, code := kubectl(t, d.s, "", append([]string{"top"}, args...)...)
			return code == 0 && strings.Contains(out, args[1]), nil
		}
	}
	framework.Eventually(t, 2*time.Minute, "kubectl top pod box", top(append([]string{"pod", "box"}, ns...)...))
	framework.Eventually(t, 2*time.Minute, "kubectl top node "+deployVNode, top("node", deployVNode))
	framework.Eventually(t, 2*time.Minute, "kubectl top node "+d.worker, top("node", d.worker))
	return box
}

// poolShareReserved: an ordinary pod that would fit the worker if the
// sandbox pool's share were ignored stays Pending with the scheduler's
// message.
func (d *deployed) poolShareReserved(t *testing.T) {
	ctx := t.Context()
	w, err := d.s.Kube.CoreV1().Nodes().Get(ctx, d.worker, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	alloc := w.Status.Allocatable.Memory().DeepCopy()
	share := resource.MustParse(deployPoolMemory)
	want := alloc.DeepCopy()
	want.Sub(share)
	want.Add(resource.MustParse("1Gi"))
	if want.Cmp(alloc) >= 0 {
		t.Fatalf("the worker's allocatable memory %s is too small for this test", alloc.String())
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: d.ns},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "big", Image: d.s.BusyboxImage, Command: []string{"sleep", "60"},
			Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceMemory: want}}}}},
	}
	if _, err := d.s.Kube.CoreV1().Pods(d.ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = d.s.Kube.CoreV1().Pods(d.ns).Delete(context.Background(), "big", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	}()
	var msg string
	framework.Eventually(t, time.Minute, "pod big Unschedulable", func(ctx context.Context) (bool, error) {
		p, err := d.s.Kube.CoreV1().Pods(d.ns).Get(ctx, "big", metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		if p.Spec.NodeName != "" {
			return false, fmt.Errorf("pod big (%s memory, allocatable %s, pool share %s) was scheduled to %s", want.String(), alloc.String(), share.String(), p.Spec.NodeName)
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				msg = c.Message
				return true, nil
			}
		}
		return false, nil
	})
	if !strings.Contains(msg, "Insufficient memory") {
		t.Fatalf("scheduler's message: %q", msg)
	}
}

// retag copies repo:from to repo:to in the stack's registry.
func retag(t *testing.T, registry, repo, from, to string) {
	t.Helper()
	const accept = "application/vnd.oci.image.manifest.v1+json, application/vnd.oci.image.index.v1+json, application/vnd.docker.distribution.manifest.v2+json"
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+registry+"/v2/"+repo+"/manifests/"+from, nil)
	req.Header.Set("Accept", accept)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("get %s:%s: %s", repo, from, resp.Status)
	}
	req, _ = http.NewRequestWithContext(t.Context(), http.MethodPut, "http://"+registry+"/v2/"+repo+"/manifests/"+to, bytes.NewReader(body))
	req.Header.Set("Content-Type", resp.Header.Get("Content-Type"))
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Fatalf("put %s:%s: %s", repo, to, resp.Status)
	}
}

// patchAgent applies a JSON patch to the DaemonSet.
func (d *deployed) patchAgent(t *testing.T, patch string) {
	t.Helper()
	if _, err := d.s.Kube.AppsV1().DaemonSets(deployNS).Patch(t.Context(), "sandman-node", types.JSONPatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatalf("patch the DaemonSet %s: %v", patch, err)
	}
}

// rollingUpdate: the DaemonSet rolls to a new tag; every bound sandbox keeps
// answering at the same address, and kubectl exec works through the new agent.
func (d *deployed) rollingUpdate(t *testing.T, box *corev1.Pod) {
	if box == nil {
		t.Skip("no sandbox from the exec phase")
	}
	idle := d.sandbox(t, "idle")
	boxes := []*corev1.Pod{box, idle}
	old, err := d.agentPod(t.Context())
	if err != nil || old == nil {
		t.Fatalf("agent pod: %v", err)
	}
	tag := "roll-" + rand.String(5)
	retag(t, d.s.Registry, "sandman/sandman-node", "dev", tag)
	image := d.s.Registry + "/sandman/sandman-node:" + tag
	d.patchAgent(t, `[{"op":"replace","path":"/spec/template/spec/containers/0/image","value":"`+image+`"}]`)
	pod := d.waitAgentReady(t, image, 3*time.Minute)
	if pod.UID == old.UID {
		t.Fatal("the agent pod was not replaced")
	}
	for _, b := range boxes {
		p, err := d.s.Kube.CoreV1().Pods(d.ns).Get(t.Context(), b.Name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if p.Status.PodIP != b.Status.PodIP || p.Status.Phase != corev1.PodRunning ||
			p.Status.ContainerStatuses[0].ContainerID != b.Status.ContainerStatuses[0].ContainerID {
			t.Fatalf("sandbox %s changed across the roll: IP %s → %s, phase %s, container %s → %s", b.Name, b.Status.PodIP, p.Status.PodIP,
				p.Status.Phase, b.Status.ContainerStatuses[0].ContainerID, p.Status.ContainerStatuses[0].ContainerID)
		}
		if err := answers(t.Context(), p); err != nil {
			t.Fatal(err)
		}
	}
	framework.Eventually(t, time.Minute, "kubectl exec through the new agent", func(ctx context.Context) (bool, error) {
		out, _, code := kubectl(t, d.s, "", "-n", d.ns, "exec", "idle", "--", "echo", "still here")
		return code == 0 && out == "still here\n", nil
	})
	// The pool watches the new agent again on its reconnect back-off (up
	// to 10 s while the agent answered "starting"), which kubectl exec
	// does not wait for: it reaches the sandbox's daemon directly.
	framework.Eventually(t, time.Minute, "the pool to hold both sandboxes bound on the new agent", func(ctx context.Context) (bool, error) {
		c, err := d.capacity(ctx)
		if err != nil {
			return false, nil
		}
		if len(c.Nodes) != 1 {
			return false, fmt.Errorf("after the roll the pool has %d nodes, want 1: %+v", len(c.Nodes), c.Nodes)
		}
		return c.Nodes[0].Healthy && c.Nodes[0].Slots[runtime.StateBound] == 2, nil
	})
}

// unreachableContainerd: an agent given a wrong containerd socket is not
// Ready and says why in its log and in its events; the virtual node shows
// the worker unhealthy with that reason; the worker, the sandboxes and the
// control plane are unaffected; the right socket brings it back.
func (d *deployed) unreachableContainerd(t *testing.T, box *corev1.Pod) {
	ctx := t.Context()
	const bad = "/run/containerd/nope.sock"
	ds, err := d.s.Kube.AppsV1().DaemonSets(deployNS).Get(ctx, "sandman-node", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	args := ds.Spec.Template.Spec.Containers[0].Args
	idx := -1
	for i, a := range args {
		if strings.HasPrefix(a, "--containerd-address=") {
			idx = i
		}
	}
	if idx < 0 {
		t.Fatalf("no --containerd-address in %v", args)
	}
	good := args[idx]
	path := "/spec/template/spec/containers/0/args/" + strconv.Itoa(idx)
	d.patchAgent(t, `[{"op":"replace","path":"`+path+`","value":"--containerd-address=`+bad+`"}]`)
	restored := false
	restore := func() {
		if !restored {
			restored = true
			d.patchAgent(t, `[{"op":"replace","path":"`+path+`","value":"`+good+`"}]`)
		}
	}
	defer restore()

	var pod *corev1.Pod
	framework.Eventually(t, 2*time.Minute, "the new agent pod Running and not Ready", func(ctx context.Context) (bool, error) {
		p, err := d.agentPod(ctx)
		if err != nil || p == nil {
			return false, nil
		}
		pod = p
		has := false
		for _, a := range p.Spec.Containers[0].Args {
			has = has || a == "--containerd-address="+bad
		}
		return has && p.Status.Phase == corev1.PodRunning && !podReady(p), nil
	})
	framework.Eventually(t, time.Minute, "the reason in the agent's log", func(ctx context.Context) (bool, error) {
		b, err := d.s.Kube.CoreV1().Pods(deployNS).GetLogs(pod.Name, &corev1.PodLogOptions{}).DoRaw(ctx)
		return err == nil && strings.Contains(string(b), "containerd unreachable at "+bad), nil
	})
	framework.Eventually(t, time.Minute, "the reason in the agent pod's events", func(ctx context.Context) (bool, error) {
		evs, err := d.s.Kube.CoreV1().Events(deployNS).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod.Name})
		if err != nil {
			return false, nil
		}
		for _, e := range evs.Items {
			if e.Reason == "Unhealthy" && strings.Contains(e.Message, "containerd unreachable at "+bad) {
				return true, nil
			}
		}
		return false, nil
	})
	framework.Eventually(t, time.Minute, "the virtual node to show the worker unhealthy", func(ctx context.Context) (bool, error) {
		c, err := d.capacity(ctx)
		return err == nil && len(c.Nodes) == 1 && !c.Nodes[0].Healthy && strings.Contains(c.Nodes[0].Error, "containerd unreachable"), nil
	})
	// Nothing else broke: the worker is Ready, the virtual node is Ready,
	// the sandbox answers, the apiserver serves.
	w, err := d.s.Kube.CoreV1().Nodes().Get(ctx, d.worker, metav1.GetOptions{})
	if err != nil || !nodeReady(w) {
		t.Fatalf("worker %s: %v", d.worker, err)
	}
	vn, err := d.s.Kube.CoreV1().Nodes().Get(ctx, deployVNode, metav1.GetOptions{})
	if err != nil || !nodeReady(vn) {
		t.Fatalf("virtual node: %v", err)
	}
	if box != nil {
		if err := answers(ctx, box); err != nil {
			t.Fatal(err)
		}
	}

	restore()
	d.waitAgentReady(t, "", 2*time.Minute)
	framework.Eventually(t, time.Minute, "the worker healthy again", func(ctx context.Context) (bool, error) {
		c, err := d.capacity(ctx)
		return err == nil && len(c.Nodes) == 1 && c.Nodes[0].Healthy && c.Nodes[0].Slots[runtime.StateBound] == 2, nil
	})
}

// followAgentLog follows the worker's agent's log until its container
// ends, and prints it if the test fails: its uninstall is what the test
// checks, and its pod's log is gone with the namespace.
func (d *deployed) followAgentLog(t *testing.T) {
	pod, err := d.agentPod(t.Context())
	if err != nil || pod == nil {
		t.Fatalf("the worker's agent pod: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	cmd := exec.CommandContext(ctx, d.s.Env["KUBECTL"], "logs", "-f", "-n", deployNS, pod.Name)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+d.s.Env["KUBECONFIG"])
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cancel()
			<-done
		}
		cancel()
		if t.Failed() {
			t.Logf("agent %s log:\n%s", pod.Name, out.String())
		}
	})
}

// uninstall: `kubectl delete -k` with sandboxes still bound leaves nothing
// of sandman's on the worker.
func (d *deployed) uninstall(t *testing.T) {
	ctx := t.Context()
	d.followAgentLog(t)
	d.kubectl(t, "delete", "-k", d.overlay(), "--wait", "--timeout=3m")
	if _, err := d.s.Kube.CoreV1().Namespaces().Get(ctx, deployNS, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("namespace %s still there: %v", deployNS, err)
	}
	ctr := d.s.Containerd(t, deployCtrdNS)
	cs, err := ctr.Containers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != 0 {
		t.Fatalf("%d containers left in containerd namespace %s", len(cs), deployCtrdNS)
	}
	nss, err := ctr.NamespaceService().List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nss {
		if n == deployCtrdNS {
			t.Errorf("containerd namespace %s still there", n)
		}
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(mounts), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], deployStateDir+"/") {
			t.Errorf("mount left under %s: %s", deployStateDir, f[4])
		}
	}
	// Addresses: host-local holds only those of the kubelet's own pods.
	// The agent released its slots' before it exited; the kubelet tears
	// the sandboxes of the deleted sandman-vk pods down after their API
	// objects are gone, so their addresses may take a moment.
	var stale []string
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		held, _ := filepath.Glob("/var/lib/cni/networks/sandman-worker/[0-9]*")
		pods, err := d.s.Kube.CoreV1().Pods("").List(ctx, metav1.ListOptions{FieldSelector: "spec.nodeName=" + d.worker})
		if err != nil {
			return false, nil
		}
		live := map[string]bool{}
		for _, p := range pods.Items {
			live[p.Status.PodIP] = true
		}
		stale = stale[:0]
		for _, h := range held {
			if ip := filepath.Base(h); !live[ip] {
				stale = append(stale, ip)
			}
		}
		return len(stale) == 0, nil
	})
	if err != nil {
		t.Errorf("addresses still held in host-local after 1m, of no pod on the worker: %v", stale)
	}
	for _, ctl := range []string{"memory", "cpu", "pids"} {
		if ents, err := os.ReadDir(filepath.Join("/sys/fs/cgroup", ctl, deployCtrdNS)); err == nil && len(ents) > 0 {
			for _, e := range ents {
				if e.IsDir() {
					t.Errorf("cgroup left: /sys/fs/cgroup/%s/%s/%s", ctl, deployCtrdNS, e.Name())
				}
			}
		}
	}
	if _, err := os.Stat(filepath.Join(deployStateDir, "bin", "sandman-daemon")); err == nil {
		t.Error("the daemon binary is still on the worker")
	}
	// The virtual node object is owned by the namespace: the garbage
	// collector deletes it.
	framework.Eventually(t, 2*time.Minute, "the virtual node object deleted", func(ctx context.Context) (bool, error) {
		_, err := d.s.Kube.CoreV1().Nodes().Get(ctx, deployVNode, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// gateway: the installed sandman-gateway serves E2B's API through its
// Service once the operator adds a key: a sandbox created through it runs
// a command through its proxy (envd's protocol) and is deleted by it.
func (d *deployed) gateway(t *testing.T) {
	s := d.s
	ctx := t.Context()
	framework.Eventually(t, 2*time.Minute, "deployment sandman-gateway available", func(ctx context.Context) (bool, error) {
		dep, err := s.Kube.AppsV1().Deployments(deployNS).Get(ctx, "sandman-gateway", metav1.GetOptions{})
		return err == nil && dep.Status.AvailableReplicas >= 1, nil
	})
	// The gateway's pod rights in the trainers' namespace, as an operator
	// grants them (deploy/base/gateway.yaml): nothing binds them
	// cluster-wide.
	grant := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "sandman-gateway", Namespace: d.ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "sandman-gateway-tenant"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Name: "sandman-gateway", Namespace: deployNS}},
	}
	if _, err := s.Kube.RbacV1().RoleBindings(d.ns).Create(ctx, grant, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	key := "e2b_" + rand.String(32)
	sum := sha256.Sum256([]byte(key))
	entry, _ := json.Marshal(map[string]string{"sha256": hex.EncodeToString(sum[:]), "namespace": d.ns, "pool": deployPool})
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "sandman-gateway-keys", Namespace: deployNS}, Data: map[string][]byte{"e2e": entry}}
	if _, err := s.Kube.CoreV1().Secrets(deployNS).Create(ctx, secret, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	svc, err := s.Kube.CoreV1().Services(deployNS).Get(ctx, "sandman-gateway", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + net.JoinHostPort(svc.Spec.ClusterIP, "3000")
	var created struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	call := func(ctx context.Context, method, path, body string) (int, []byte, error) {
		req, err := http.NewRequestWithContext(ctx, method, url+path, strings.NewReader(body))
		if err != nil {
			return 0, nil, err
		}
		req.Header.Set("X-API-Key", key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, b, err
	}
	// The key reaches the gateway through its watch of the Secret.
	framework.Eventually(t, 2*time.Minute, "a sandbox created through the gateway's Service", func(ctx context.Context) (bool, error) {
		code, b, err := call(ctx, http.MethodPost, "/v2/sandboxes", `{"templateID":"`+s.BusyboxImage+`","timeout":300}`)
		if err != nil || code == http.StatusUnauthorized {
			return false, nil
		}
		if code != http.StatusCreated {
			return false, fmt.Errorf("create: %d %s", code, b)
		}
		return true, json.Unmarshal(b, &created)
	})
	pc := processconnect.NewProcessClient(&http.Client{Transport: headerTransport{
		"E2b-Sandbox-Id": created.SandboxID, "E2b-Sandbox-Port": "49983", "X-Access-Token": created.EnvdAccessToken,
	}}, url, connect.WithProtoJSON())
	stream, err := pc.Start(ctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "echo deployed"}}}))
	if err != nil {
		t.Fatal(err)
	}
	var out string
	exit := int32(-100)
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		out += string(ev.GetData().GetStdout())
		if end := ev.GetEnd(); end != nil {
			exit = end.ExitCode
		}
	}
	if err := stream.Err(); err != nil || out != "deployed\n" || exit != 0 {
		t.Fatalf("a command through the gateway: %q exit %d %v", out, exit, err)
	}
	if code, b, err := call(ctx, http.MethodDelete, "/sandboxes/"+created.SandboxID, ""); err != nil || code != http.StatusNoContent {
		t.Fatalf("kill: %d %s %v", code, b, err)
	}
	framework.Eventually(t, time.Minute, "the sandbox's pod gone", func(ctx context.Context) (bool, error) {
		_, err := s.Kube.CoreV1().Pods(d.ns).Get(ctx, created.SandboxID, metav1.GetOptions{})
		return apierrors.IsNotFound(err), nil
	})
}

// headerTransport adds headers to every request (the SDK's single-endpoint
// routing headers and the access token).
type headerTransport map[string]string

func (h headerTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	req = req.Clone(req.Context())
	for k, v := range h {
		req.Header.Set(k, v)
	}
	return http.DefaultTransport.RoundTrip(req)
}

// gvisor: the installed RuntimeClass runs a pod under gVisor, with the runsc
// the agent's image carries (copied to the worker at start).
func (d *deployed) gvisor(t *testing.T) {
	d.sandboxWith(t, "guest", func(p *corev1.Pod) { p.Spec.RuntimeClassName = ptr.To("gvisor") }, "sleep", "3600")
	if out := d.kubectl(t, "-n", d.ns, "exec", "guest", "--", "uname", "-r"); !strings.Contains(out, "gvisor") {
		t.Fatalf("kubectl exec guest -- uname -r: %q, want gVisor's kernel", out)
	}
	d.kubectl(t, "-n", d.ns, "delete", "pod", "guest", "--wait", "--timeout=1m")
}

// TestDeployLazyPullComponent: deploy/components/lazy-pull composes with the
// base: the agent unpacks with stargz and pulls lazily, stargz-snapshotter
// runs beside it from the agent's image, and both see its root (the
// snapshotter's mounts reach the host, Bidirectional; the agent sees them).
func TestDeployLazyPullComponent(t *testing.T) {
	s := framework.Get(t)
	dir := t.TempDir()
	rel, err := filepath.Rel(dir, filepath.Join(s.Root, "deploy"))
	if err != nil {
		t.Fatal(err)
	}
	k := "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n" +
		"resources: [" + rel + "/base]\ncomponents: [" + rel + "/components/lazy-pull]\n"
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := kubectl(t, s, "", "kustomize", "--load-restrictor=LoadRestrictionsNone", dir)
	if code != 0 {
		t.Fatalf("kubectl kustomize: exit %d: %s", code, errOut)
	}
	var ds appsv1.DaemonSet
	for doc := range strings.SplitSeq(out, "\n---\n") {
		if strings.Contains(doc, "kind: DaemonSet") {
			if err := yaml.Unmarshal([]byte(doc), &ds); err != nil {
				t.Fatal(err)
			}
		}
	}
	cs := ds.Spec.Template.Spec.Containers
	if len(cs) != 2 || cs[0].Name != "sandman-node" || cs[1].Name != "stargz-snapshotter" {
		t.Fatalf("containers %v: want sandman-node and stargz-snapshotter", cs)
	}
	args := strings.Join(cs[0].Args, " ")
	for _, want := range []string{"--snapshotter=stargz", "--lazy-pull", "--namespace=sandman"} {
		if !strings.Contains(args, want) {
			t.Errorf("the agent's args %q lack %s", args, want)
		}
	}
	if cs[1].Image != cs[0].Image || !strings.HasSuffix(cs[1].Command[0], "/containerd-stargz-grpc") {
		t.Errorf("snapshotter: image %s command %v, want the agent's image %s running containerd-stargz-grpc", cs[1].Image, cs[1].Command, cs[0].Image)
	}
	propagation := func(c corev1.Container) corev1.MountPropagationMode {
		for _, m := range c.VolumeMounts {
			if m.MountPath == "/var/lib/containerd-stargz-grpc" && m.MountPropagation != nil {
				return *m.MountPropagation
			}
		}
		return ""
	}
	if propagation(cs[1]) != corev1.MountPropagationBidirectional || propagation(cs[0]) != corev1.MountPropagationHostToContainer {
		t.Errorf("stargz root propagation: snapshotter %q, agent %q; want Bidirectional and HostToContainer", propagation(cs[1]), propagation(cs[0]))
	}
}

package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	kfake "k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/sandman-dev/sandman/podcontract"
)

// fakeCluster is client-go's fake clientset whose pods get names from
// generateName, and are Ready at once unless notReady says otherwise;
// failCreate, when set, fails the nth create (1-based).
func fakeCluster(notReady func(n int) bool, failCreate int) *kfake.Clientset {
	kube := kfake.NewClientset()
	var n atomic.Int32
	kube.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, kruntime.Object, error) {
		i := int(n.Add(1))
		if i == failCreate {
			return true, nil, fmt.Errorf("pods is forbidden: exceeded quota")
		}
		pod := a.(k8stesting.CreateAction).GetObject().(*corev1.Pod)
		if pod.Name == "" {
			pod.Name = fmt.Sprintf("%s%05d", pod.GenerateName, i)
		}
		if notReady == nil || !notReady(i) {
			pod.Status.Phase = corev1.PodRunning
			pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		}
		return false, nil, nil
	})
	return kube
}

func TestRunCountCreatesAndWaitsForAll(t *testing.T) {
	kube := fakeCluster(nil, 0)
	c, out, _ := testCtl(t, kube)
	snap := "reg.local/envs/prepared:v1@sha256:feed"
	if err := c.run(t.Context(), []string{"--image", snap, "--count", "5", "--wait", "10s", "--job", "j", "sleep", "1d"}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 5 {
		t.Fatalf("output %q", out.String())
	}
	pods, _ := kube.CoreV1().Pods("ns").List(t.Context(), metav1.ListOptions{})
	if len(pods.Items) != 5 {
		t.Fatalf("%d pods", len(pods.Items))
	}
	hashes, runs := map[string]bool{}, map[string]bool{}
	for _, p := range pods.Items {
		hashes[p.Annotations["sandman.io/token-sha256"]] = true
		runs[p.Labels[podcontract.LabelRun]] = true
		if c := p.Spec.Containers[0]; c.Image != snap || !slices.Equal(c.Command, []string{"sleep", "1d"}) || p.Labels["sandman.io/job"] != "j" ||
			!strings.HasPrefix(p.Name, "sandbox-") {
			t.Fatalf("pod %s: %+v", p.Name, p)
		}
	}
	if len(hashes) != 5 || len(runs) != 1 {
		t.Fatalf("token hashes %v, runs %v", hashes, runs)
	}
	for _, l := range lines {
		name, file, _ := strings.Cut(l, "\t")
		fi, err := os.Stat(file)
		if err != nil || fi.Mode().Perm() != 0o600 || filepath.Base(file) != name || filepath.Base(filepath.Dir(file)) != "ns" {
			t.Fatalf("token file of %s: %s %v", name, file, err)
		}
	}
}

func TestRunCountNamesThoseNotReady(t *testing.T) {
	kube := fakeCluster(func(n int) bool { return n == 2 }, 0)
	c, out, _ := testCtl(t, kube)
	err := c.run(t.Context(), []string{"--count", "3", "--name", "env", "--wait", "500ms", "img"})
	if exitCode(err) != exitError || !strings.Contains(err.Error(), "1 of 3 sandboxes are not Ready") || !strings.Contains(err.Error(), "sandbox env-00002 not Ready after 500ms") {
		t.Fatalf("got %v", err)
	}
	if got := strings.Count(out.String(), "\n"); got != 2 || strings.Contains(out.String(), "env-00002") {
		t.Fatalf("ready ones printed: %q", out.String())
	}
}

func TestRunCountUndoesAFailedCreate(t *testing.T) {
	kube := fakeCluster(nil, 3)
	c, out, _ := testCtl(t, kube)
	err := c.run(t.Context(), []string{"--count", "4", "img"})
	if err == nil || !strings.Contains(err.Error(), "exceeded quota") || !strings.Contains(err.Error(), "deleted again") {
		t.Fatalf("got %v", err)
	}
	pods, _ := kube.CoreV1().Pods("ns").List(t.Context(), metav1.ListOptions{})
	if len(pods.Items) != 0 || out.Len() != 0 {
		t.Fatalf("left %d pods, printed %q", len(pods.Items), out.String())
	}
	if files, _ := filepath.Glob(filepath.Join(c.tokenDir, "ns", "*")); len(files) != 0 {
		t.Fatalf("token files left: %v", files)
	}
}

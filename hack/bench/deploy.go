package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"golang.org/x/sync/errgroup"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
)

// benchDeploy: create → Ready of a burst of real sandboxes through the
// deployed path (deploy/overlays/local: sandman-node as a DaemonSet pod on
// the kubelet worker, sandman-vk as a Deployment) beside the host-process
// path (sandman-vk and the node agent as processes), same run, same slots.
func benchDeploy(cfg config) ([]row, error) {
	b, ctx, done, err := newVKBench(cfg, "sandman-bench-deploy")
	if err != nil {
		return nil, err
	}
	defer done()
	env, kube := b.env, b.kube
	image := env["BUSYBOX_IMAGE"]
	const n, slots, warm = 100, 104, 16

	// The host-process path: with the stack's slot network (bridge only),
	// and with the worker's CNI config the deployed agent uses (bridge with
	// masquerade + portmap, on the node's pod CIDR), to tell the cost of the
	// network from the cost of running as a pod.
	hostBurst := func(name, cniConfDir string) (burstResult, error) {
		rt, stop, err := b.be.startRuntime(ctx, name, func(c *noderuntime.Config) {
			c.Slots, c.WarmSlots = slots, warm
			if cniConfDir != "" {
				c.CNIConfDir = cniConfDir
			}
		})
		if err != nil {
			return burstResult{}, err
		}
		defer stop()
		if err := waitCount(ctx, rt, runtime.StateWarm, warm); err != nil {
			return burstResult{}, err
		}
		return b.burst(ctx, name, map[string]runtime.Runtime{name: rt}, image, n, false)
	}
	host, err := hostBurst("bench-deploy-host", "")
	if err != nil {
		return nil, fmt.Errorf("host-process burst: %w", err)
	}
	hostWorkerCNI, err := hostBurst("bench-deploy-host-cni", "/etc/cni/net.d")
	if err != nil {
		return nil, fmt.Errorf("host-process burst, worker CNI: %w", err)
	}

	// The deployed path: the overlay, with as many slots.
	kubectl := func(args ...string) error {
		cmd := exec.Command(env["KUBECTL"], args...)
		cmd.Env = append(os.Environ(), "KUBECONFIG="+env["KUBECONFIG"])
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("kubectl %v: %v\n%s", args, err, out)
		}
		return nil
	}
	overlay := filepath.Join(cfg.root, "deploy", "overlays", "local")
	if err := kubectl("apply", "-k", overlay); err != nil {
		return nil, err
	}
	defer func() {
		_ = kubectl("delete", "-k", overlay, "--wait", "--timeout=3m")
		_ = kube.CoreV1().Nodes().Delete(context.Background(), "sandman-deployed", metav1.DeleteOptions{})
	}()
	ds, err := kube.AppsV1().DaemonSets("sandman-system").Get(ctx, "sandman-node", metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	args := ds.Spec.Template.Spec.Containers[0].Args
	for i, a := range args {
		switch {
		case len(a) > 8 && a[:8] == "--slots=":
			args[i] = fmt.Sprintf("--slots=%d", slots)
		case len(a) > 13 && a[:13] == "--warm-slots=":
			args[i] = fmt.Sprintf("--warm-slots=%d", warm)
		}
	}
	// Generic binds, as on the host-process path (its runtime has no hot
	// slots): the comparison is of the paths, not of hot slots.
	args = append(args, "--hot-slots=0")
	patch, _ := json.Marshal([]map[string]any{{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": args}})
	if _, err := kube.AppsV1().DaemonSets("sandman-system").Patch(ctx, "sandman-node", types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
		return nil, err
	}
	if err := waitFor(5*time.Minute, "the deployed virtual node with its warm slots", func() bool {
		n, err := kube.CoreV1().Nodes().Get(ctx, "sandman-deployed", metav1.GetOptions{})
		if err != nil || n.Status.Capacity.Pods().Value() != slots {
			return false
		}
		c := deployedCapacity(ctx, kube)
		return c != nil && c[runtime.StateWarm] >= warm
	}); err != nil {
		return nil, err
	}
	dep, err := b.burstOn(ctx, "deployed", image, n)
	if err != nil {
		return nil, fmt.Errorf("deployed burst: %w", err)
	}
	return []row{
		{name: "burst of 100, host-process path: create → Ready (baseline)", n: n, p50: ms(host.ready.p50()), p99: ms(host.ready.p99()), baseline: "-", ratio: "1.00×",
			note: fmt.Sprintf("%.0f pods/s to all Ready", float64(n)/host.total.Seconds())},
		{name: "burst of 100, host-process path, the worker's CNI config: create → Ready", n: n, p50: ms(hostWorkerCNI.ready.p50()), p99: ms(hostWorkerCNI.ready.p99()), baseline: "host-process path", ratio: ratio(hostWorkerCNI.ready.p50(), host.ready.p50()),
			note: fmt.Sprintf("%.0f pods/s to all Ready; bridge with masquerade + portmap on the node's pod CIDR", float64(n)/hostWorkerCNI.total.Seconds())},
		{name: "burst of 100, deployed path: create → Ready", n: n, p50: ms(dep.ready.p50()), p99: ms(dep.ready.p99()), baseline: "host-process path", ratio: ratio(dep.ready.p50(), host.ready.p50()),
			note: fmt.Sprintf("%.0f pods/s to all Ready; sandman-vk and sandman-node as pods, %d slots, %d warm", float64(n)/dep.total.Seconds(), slots, warm)},
	}, nil
}

// deployedCapacity reads the deployed virtual node's slot counts.
func deployedCapacity(ctx context.Context, kube kubernetes.Interface) map[runtime.SlotState]int {
	raw, err := kube.CoreV1().RESTClient().Get().AbsPath("/api/v1/nodes/sandman-deployed/proxy/sandman/v1/capacity").DoRaw(ctx)
	if err != nil {
		return nil
	}
	var c struct {
		Totals struct {
			Slots map[runtime.SlotState]int `json:"slots"`
		} `json:"totals"`
	}
	if json.Unmarshal(raw, &c) != nil {
		return nil
	}
	return c.Totals.Slots
}

// burstOn creates n pods at once on a pool whose virtual node runs
// elsewhere, measures them to Ready and deletes them.
func (b *vkBench) burstOn(ctx context.Context, pool, image string, n int) (burstResult, error) {
	res := burstResult{n: n}
	rw, err := b.watchReady(ctx)
	if err != nil {
		return res, err
	}
	defer rw.stop()
	names := make([]string, n)
	starts := make([]time.Time, n)
	var g errgroup.Group
	g.SetLimit(64)
	begin := time.Now()
	for i := range n {
		names[i] = fmt.Sprintf("%s-%04d", pool, i)
		g.Go(func() error {
			starts[i] = time.Now()
			_, err := b.kube.CoreV1().Pods(b.ns).Create(ctx, b.pod(names[i], pool, image, ""), metav1.CreateOptions{})
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return res, err
	}
	at, err := rw.wait(names, 5*time.Minute)
	if err != nil {
		return res, fmt.Errorf("%w (%s)", err, b.podSummary(ctx))
	}
	res.ready, res.total = readyTimes(names, starts, at, begin)
	var dg errgroup.Group
	dg.SetLimit(64)
	for _, name := range names {
		dg.Go(func() error {
			if err := b.kube.CoreV1().Pods(b.ns).Delete(ctx, name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			return nil
		})
	}
	if err := dg.Wait(); err != nil {
		return res, err
	}
	return res, b.waitGoneFor(ctx, 2*time.Minute)
}

// waitFor polls cond every 200 ms.
func waitFor(timeout time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("waiting %v for %s", timeout, what)
		}
		time.Sleep(200 * time.Millisecond)
	}
	return nil
}

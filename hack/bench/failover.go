package main

import (
	"fmt"
	"strconv"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandman-dev/sandman/runtime"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
)

// benchFailover measures sandman-vk's failover: two replicas of
// one virtual node over a node agent on the stack's containerd, 20 sandbox
// pods Ready, then the leader SIGKILLed and one new pod created at once.
// Per run: kill → the standby holds the Lease, and kill → the new pod is
// Ready. The baseline is the same new pod's create → Ready with the leader
// alive, in the same run.
func benchFailover(cfg config) ([]row, error) {
	b, ctx, done, err := newVKBench(cfg, "sandman-bench-failover")
	if err != nil {
		return nil, err
	}
	defer done()
	image := b.env["BUSYBOX_IMAGE"]
	rt, stopRT, err := b.be.startRuntime(ctx, "bench-failover", func(c *noderuntime.Config) { c.Slots, c.WarmSlots = 32, 4 })
	if err != nil {
		return nil, err
	}
	defer stopRT()
	agents, stopAgents, err := serveAgents(ctx, map[string]runtime.Runtime{"bench-failover": rt})
	if err != nil {
		return nil, err
	}
	defer stopAgents()
	rw, err := b.watchReady(ctx)
	if err != nil {
		return nil, err
	}
	defer rw.stop()
	const pool = "failover"
	lease := "sandman-vk-sandman-bench-" + pool
	holder := func() string {
		l, err := b.kube.CoordinationV1().Leases(b.ns).Get(ctx, lease, metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return ""
		}
		return *l.Spec.HolderIdentity
	}
	waitHolder := func(not string, timeout time.Duration) (string, error) {
		deadline := time.Now().Add(timeout)
		for {
			if h := holder(); h != "" && h != not {
				return h, nil
			}
			if time.Now().After(deadline) {
				return "", fmt.Errorf("no new holder of Lease %s within %v", lease, timeout)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	elect := []string{"--leader-elect", "--leader-elect-namespace", b.ns}
	runs := min(cfg.n, 5)
	var lead, ready, alive durations
	for run := range runs {
		leader, err := b.startVK(ctx, pool, agents, elect...)
		if err != nil {
			return nil, err
		}
		first, err := waitHolder("", time.Minute)
		if err != nil {
			leader.stop(b.kube)
			return nil, err
		}
		standby, err := b.startVK(ctx, pool, agents, elect...)
		if err != nil {
			leader.stop(b.kube)
			return nil, err
		}
		var names []string
		for i := range 20 {
			names = append(names, fmt.Sprintf("r%d-%d", run, i))
		}
		for _, n := range names {
			if _, err := b.kube.CoreV1().Pods(b.ns).Create(ctx, b.pod(n, pool, image, ""), metav1.CreateOptions{}); err != nil {
				return nil, err
			}
		}
		if _, err := rw.wait(names, 2*time.Minute); err != nil {
			return nil, err
		}
		// The baseline: one pod with the leader alive.
		base := "r" + strconv.Itoa(run) + "-alive"
		start := time.Now()
		if _, err := b.kube.CoreV1().Pods(b.ns).Create(ctx, b.pod(base, pool, image, ""), metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		at, err := rw.wait([]string{base}, time.Minute)
		if err != nil {
			return nil, err
		}
		alive = append(alive, at[base].Sub(start))

		_ = leader.cmd.Process.Kill()
		_ = leader.cmd.Wait()
		killed := time.Now()
		after := "r" + strconv.Itoa(run) + "-after"
		if _, err := b.kube.CoreV1().Pods(b.ns).Create(ctx, b.pod(after, pool, image, ""), metav1.CreateOptions{}); err != nil {
			return nil, err
		}
		if _, err := waitHolder(first, 30*time.Second); err != nil {
			return nil, err
		}
		lead = append(lead, time.Since(killed))
		at, err = rw.wait([]string{after}, 2*time.Minute)
		if err != nil {
			return nil, err
		}
		ready = append(ready, at[after].Sub(killed))
		// The standby leads now: the pods go while it serves them.
		if err := b.kube.CoreV1().Pods(b.ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
			return nil, err
		}
		if err := b.waitGoneFor(ctx, 2*time.Minute); err != nil {
			return nil, err
		}
		// SIGTERM releases the Lease: the next run's leader takes it at once.
		standby.stop(b.kube)
	}
	return []row{
		{name: "pod create → Ready, leader alive (baseline)", n: len(alive), p50: ms(alive.p50()), p99: ms(alive.p99()), baseline: "-", ratio: "1.00×"},
		{name: "failover: leader SIGKILLed → standby holds the Lease", n: len(lead), p50: ms(lead.p50()), p99: ms(lead.p99()), baseline: "-", ratio: "-", note: "lease 10 s, renew deadline 7 s, retry 2 s; target ≤ 15 s"},
		{name: "failover: leader SIGKILLed → a pod created then is Ready", n: len(ready), p50: ms(ready.p50()), p99: ms(ready.p99()), baseline: "leader alive", ratio: ratio(ready.p50(), alive.p50()), note: "the new leader adopts, then places"},
	}, nil
}

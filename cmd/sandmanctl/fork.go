package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandman-dev/sandman/podcontract"
)

// fork creates --count live forks of a running gVisor sandbox: pods with
// its spec, on its virtual node, naming it in podcontract.AnnotationForkOf
// and one fork ID, so that all start from one checkpoint of it. Each gets
// a fresh token, kept as run keeps them; the names and token files are
// printed once all are Ready.
func (c *ctl) fork(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("fork", flag.ContinueOnError)
	fs.SetOutput(c.errw)
	count := fs.Int("count", 1, "how many forks")
	name := fs.String("name", "", "the forks' name prefix (default: NAME-fork-)")
	wait := fs.Duration("wait", 5*time.Minute, "how long to wait for Ready (0: do not wait)")
	if err := fs.Parse(args); err != nil {
		return cliError{code: exitUsage}
	}
	if fs.NArg() == 0 {
		return fail(exitUsage, "fork: give NAME (fork NAME [--count N])")
	}
	source := fs.Arg(0)
	// Flags may follow the name too.
	if err := fs.Parse(fs.Args()[1:]); err != nil {
		return cliError{code: exitUsage}
	}
	if fs.NArg() != 0 {
		return fail(exitUsage, "fork: give one NAME (fork NAME [--count N]), not %q", fs.Args())
	}
	if *count < 1 {
		return fail(exitUsage, "fork: --count %d: give 1 or more", *count)
	}
	src, err := c.kube.CoreV1().Pods(c.namespace).Get(ctx, source, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if src.Spec.NodeName == "" || !ready(src) {
		return fail(exitError, "sandbox %s is not running and Ready: only a running sandbox forks", src.Name)
	}
	id, err := runID()
	if err != nil {
		return err
	}
	pod := forkPod(src, id, *name)
	begin := time.Now()
	boxes, err := c.createAndWait(ctx, pod, *count, id, *wait)
	if err == nil && *wait > 0 {
		fmt.Fprintf(c.errw, "%d forks of %s Ready in %v\n", len(boxes), src.Name, time.Since(begin).Round(time.Millisecond))
	}
	return err
}

// forkPod is the pod each fork of src is made from: src's spec on src's
// node (no scheduling: a fork starts where its source runs), its job, and
// the fork's annotations; run label id marks the batch, which is also the
// fork ID. Nothing of src's status, tokens or pause carries over.
func forkPod(src *corev1.Pod, id, prefix string) *corev1.Pod {
	if prefix == "" {
		prefix = src.Name + "-fork"
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: src.Namespace, GenerateName: prefix + "-",
			Labels: map[string]string{podcontract.LabelRun: id},
			Annotations: map[string]string{
				podcontract.AnnotationForkOf: src.Name,
				podcontract.AnnotationForkID: id,
			},
		},
		Spec: *src.Spec.DeepCopy(),
	}
	if job := src.Labels[podcontract.LabelJob]; job != "" {
		pod.Labels[podcontract.LabelJob] = job
	}
	// The sandbox's lease and limits are its source's.
	for _, k := range podcontract.ForkInherited() {
		if v, ok := src.Annotations[k]; ok {
			pod.Annotations[k] = v
		}
	}
	pod.Spec.Hostname = ""
	return pod
}

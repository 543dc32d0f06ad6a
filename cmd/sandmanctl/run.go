package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/sandman-dev/sandman/podcontract"
)

// run creates sandbox pods, each with a fresh token, and waits for them.
func (c *ctl) run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("run", flag.ContinueOnError)
	fs.SetOutput(c.errw)
	pool := fs.String("pool", "default", "the pool (node selector "+podcontract.LabelPool+")")
	image := fs.String("image", "", "the image, e.g. a snapshot's IMAGE@DIGEST (else the first argument)")
	count := fs.Int("count", 1, "how many sandboxes to create at once (generated names)")
	name := fs.String("name", "", "pod name (default: sandbox-<random>); with --count, the names' prefix")
	job := fs.String("job", "", "trainer job (label "+podcontract.LabelJob+")")
	idle := fs.String("idle-timeout", "", "idle lease, e.g. 30m (annotation "+podcontract.AnnotationIdleTimeout+")")
	deadline := fs.Duration("deadline", 0, "hard deadline (spec.activeDeadlineSeconds)")
	cpu := fs.String("cpu", "", "CPU request, e.g. 500m")
	memory := fs.String("memory", "", "memory request and limit, e.g. 1Gi")
	wait := fs.Duration("wait", 2*time.Minute, "how long to wait for Ready (0: do not wait)")
	if err := fs.Parse(args); err != nil {
		return cliError{code: exitUsage}
	}
	img, command := *image, fs.Args()
	if img == "" {
		if len(command) == 0 {
			return fail(exitUsage, "run: give an image (run IMAGE [CMD...] or run --image IMAGE [CMD...])")
		}
		img, command = command[0], command[1:]
	}
	if *count < 1 {
		return fail(exitUsage, "run: --count %d: give 1 or more", *count)
	}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: c.namespace, Annotations: map[string]string{}},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{podcontract.LabelPool: *pool},
			Tolerations:  []corev1.Toleration{{Key: podcontract.LabelPool, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
			Containers:   []corev1.Container{{Name: "task", Image: img, Command: command}},
		},
	}
	switch {
	case *count == 1 && *name != "":
		pod.Name = *name
	case *name != "":
		pod.GenerateName = *name + "-"
	default:
		pod.GenerateName = "sandbox-"
	}
	id, err := runID()
	if err != nil {
		return err
	}
	pod.Labels = map[string]string{podcontract.LabelRun: id}
	if *job != "" {
		pod.Labels[podcontract.LabelJob] = *job
	}
	if *idle != "" {
		pod.Annotations[podcontract.AnnotationIdleTimeout] = *idle
	}
	if *deadline > 0 {
		s := int64(deadline.Seconds())
		pod.Spec.ActiveDeadlineSeconds = &s
	}
	res := corev1.ResourceRequirements{Requests: corev1.ResourceList{}, Limits: corev1.ResourceList{}}
	if *cpu != "" {
		q, err := resource.ParseQuantity(*cpu)
		if err != nil {
			return fail(exitUsage, "--cpu %q: %v", *cpu, err)
		}
		res.Requests[corev1.ResourceCPU] = q
	}
	if *memory != "" {
		q, err := resource.ParseQuantity(*memory)
		if err != nil {
			return fail(exitUsage, "--memory %q: %v", *memory, err)
		}
		res.Requests[corev1.ResourceMemory], res.Limits[corev1.ResourceMemory] = q, q
	}
	pod.Spec.Containers[0].Resources = res
	_, err = c.createAndWait(ctx, pod, *count, id, *wait)
	return err
}

// createAndWait creates count sandboxes from pod (run label id), waits up
// to wait (0: not at all) for them to be Ready, and prints the name and
// token file of each that is; the error names those that are not.
func (c *ctl) createAndWait(ctx context.Context, pod *corev1.Pod, count int, id string, wait time.Duration) ([]sandbox, error) {
	boxes, err := c.createSandboxes(ctx, pod, count)
	if err != nil {
		return nil, err
	}
	var waitErr error
	if wait > 0 {
		waitErr = c.waitAllReady(ctx, boxes, podcontract.LabelRun+"="+id, wait)
	}
	for _, b := range boxes {
		if b.err == nil {
			fmt.Fprintf(c.out, "%s\t%s\n", b.name, b.tokenFile)
		}
	}
	return boxes, waitErr
}

// createFanOut caps the sandboxes created at once.
const createFanOut = 16

// sandbox is one pod run creates: its name, its token file, and why it is
// not Ready (when waiting for it failed).
type sandbox struct {
	name, tokenFile string
	err             error
}

// createSandboxes creates count copies of pod, each with a fresh token
// whose SHA-256 it carries and which is kept in its token file. Either all
// are created or none: those made before a failure are deleted again.
func (c *ctl) createSandboxes(ctx context.Context, pod *corev1.Pod, count int) (_ []sandbox, retErr error) {
	boxes := make([]sandbox, count)
	defer func() {
		if retErr == nil {
			return
		}
		// Outlives a cancelled ctx (an interrupt): leave nothing half made.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		for _, b := range boxes {
			if b.name != "" {
				_ = c.kube.CoreV1().Pods(c.namespace).Delete(cctx, b.name, metav1.DeleteOptions{})
				_ = os.Remove(c.tokenFile(b.name))
			}
		}
	}()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(createFanOut)
	for i := range boxes {
		g.Go(func() error {
			token, err := newToken()
			if err != nil {
				return err
			}
			sum := sha256.Sum256([]byte(token))
			p := pod.DeepCopy()
			p.Annotations[podcontract.AnnotationTokenSHA256] = hex.EncodeToString(sum[:])
			created, err := c.kube.CoreV1().Pods(c.namespace).Create(gctx, p, metav1.CreateOptions{})
			if err != nil {
				if count > 1 {
					return fmt.Errorf("creating sandbox %d of %d: %w", i+1, count, err)
				}
				return err
			}
			boxes[i].name = created.Name
			boxes[i].tokenFile, err = c.saveToken(created.Name, token)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		if count > 1 {
			return nil, fmt.Errorf("%w (the sandboxes created are deleted again)", err)
		}
		return nil, err
	}
	return boxes, nil
}

// waitAllReady waits for every sandbox to be Ready and records in each why
// it is not. One sandbox is read on its own; several are listed together
// by their run label, one request a round whatever their number. The
// error names every sandbox not Ready.
func (c *ctl) waitAllReady(ctx context.Context, boxes []sandbox, selector string, timeout time.Duration) error {
	if len(boxes) == 1 {
		boxes[0].err = c.waitReady(ctx, boxes[0].name, timeout)
		return boxes[0].err
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	pending := map[string]int{}
	for i, b := range boxes {
		pending[b.name] = i
	}
	last := map[string]*corev1.Pod{}
	for len(pending) > 0 {
		list, err := c.kube.CoreV1().Pods(c.namespace).List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err == nil {
			for i := range list.Items {
				pod := &list.Items[i]
				j, ok := pending[pod.Name]
				if !ok {
					continue
				}
				last[pod.Name] = pod
				switch {
				case ready(pod):
					delete(pending, pod.Name)
				case pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded:
					boxes[j].err = fmt.Errorf("sandbox %s ended: %s %s", pod.Name, pod.Status.Reason, pod.Status.Message)
					delete(pending, pod.Name)
				}
			}
		}
		if len(pending) == 0 {
			break
		}
		select {
		case <-ctx.Done():
			for name, j := range pending {
				why := ""
				if pod := last[name]; pod != nil {
					why = waitingReason(pod)
				}
				boxes[j].err = fmt.Errorf("sandbox %s not Ready after %v%s", name, timeout, why)
			}
			pending = nil
		case <-time.After(250 * time.Millisecond):
		}
	}
	var bad []string
	for _, b := range boxes {
		if b.err != nil {
			bad = append(bad, b.err.Error())
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return fail(exitError, "%d of %d sandboxes are not Ready (the others are printed; inspect or delete these):\n  %s",
		len(bad), len(boxes), strings.Join(bad, "\n  "))
}

// runID labels the sandboxes of one run (label sandman.io/run).
func runID() (string, error) {
	b := make([]byte, 5)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// newToken is a fresh sandbox token: 192 random bits in hex.
func newToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// saveToken keeps the token of sandbox name in its file (0600) and
// returns the file.
func (c *ctl) saveToken(name, token string) (string, error) {
	f := c.tokenFile(name)
	if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
		return "", err
	}
	return f, os.WriteFile(f, []byte(token+"\n"), 0o600)
}

// waitReady waits for one sandbox to be Ready, saying why it is not when
// timeout passes or the pod ends.
func (c *ctl) waitReady(ctx context.Context, name string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		pod, err := c.kube.CoreV1().Pods(c.namespace).Get(ctx, name, metav1.GetOptions{})
		if err == nil {
			if ready(pod) {
				return nil
			}
			if pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
				return fail(exitError, "sandbox %s ended: %s %s", name, pod.Status.Reason, pod.Status.Message)
			}
		}
		select {
		case <-ctx.Done():
			why := ""
			if pod != nil {
				why = waitingReason(pod)
			}
			return fail(exitError, "sandbox %s not Ready after %v%s", name, timeout, why)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Command sandmanctl is the trainer's and operator's command line for
// sandboxes: run, exec, cp, ls, rm, renew, get, delete, snapshot; and the
// pool's images and capacity: prepull, images, top. It follows kubectl's
// kubeconfig conventions (--kubeconfig, $KUBECONFIG, ~/.kube/config, the
// context's namespace) and keeps each sandbox's token in a file of its own.
//
// Exit codes: 0 success; for exec, the command's exit code; 1 an error;
// 2 bad usage; 3 no such sandbox or path; 4 the daemon refused the token.
package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/archive"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/podcontract"
)

const usage = `usage: sandmanctl [global flags] COMMAND [flags] [args]

Commands:
  run IMAGE [CMD...]   create a sandbox with a fresh token, wait until it is Ready;
                       --image IMAGE --count N creates N at once (e.g. forks of a snapshot)
  exec NAME -- CMD...  run a command in a sandbox (exit code is the command's)
  cp SRC DST           copy a file or directory; NAME:/path names a sandbox path
  ls NAME:/path        list a directory in a sandbox
  rm NAME:/path        remove a path in a sandbox (-r for directories)
  renew NAME           renew a sandbox's idle lease
  get [NAME]           list sandboxes: node, phase, IP, age, idle time
  delete NAME          delete a sandbox (its slot is released)
  prepull IMAGE...     keep images unpacked on every worker; a progress bar per worker
  images               the images of every worker: state, size, pinned, in use
  top nodes            slots, CPU, memory, images and bind latency per worker (--watch)
  snapshot POD IMAGE   commit a sandbox's filesystem changes as IMAGE in the pool's
                       snapshot registry (--container C); prints IMAGE@DIGEST

Global flags:
`

// Exit codes.
const (
	exitError        = 1
	exitUsage        = 2
	exitNotFound     = 3
	exitUnauthorized = 4
)

// cliError carries an exit code.
type cliError struct {
	code int
	err  error
}

func (e cliError) Error() string { return e.err.Error() }

func fail(code int, format string, args ...any) error {
	return cliError{code: code, err: fmt.Errorf(format, args...)}
}

type ctl struct {
	kube      kubernetes.Interface
	namespace string
	tokenDir  string
	token     string
	out, errw io.Writer
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sandmanctl", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig (default $KUBECONFIG, then ~/.kube/config)")
	namespace := fs.String("n", "", "namespace (default: the kubeconfig context's)")
	home, _ := os.UserHomeDir()
	tokenDir := fs.String("token-dir", filepath.Join(home, ".sandman", "tokens"), "where sandbox tokens are kept")
	token := fs.String("token", os.Getenv("SANDMAN_TOKEN"), "token to use instead of the kept one (or $SANDMAN_TOKEN)")
	fs.Usage = func() { fmt.Fprint(stderr, usage); fs.PrintDefaults() }
	if err := fs.Parse(args); err != nil {
		return exitUsage
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return exitUsage
	}
	c := &ctl{tokenDir: *tokenDir, token: *token, out: stdout, errw: stderr}
	err := c.connect(*kubeconfig, *namespace)
	if err == nil {
		err = c.dispatch(ctx, fs.Arg(0), fs.Args()[1:])
	}
	if err == nil {
		return 0
	}
	var ce cliError
	if errors.As(err, &ce) {
		if ce.err != nil && ce.err.Error() != "" {
			fmt.Fprintf(stderr, "sandmanctl: %v\n", ce.err)
		}
		return ce.code
	}
	fmt.Fprintf(stderr, "sandmanctl: %v\n", err)
	switch {
	case apierrors.IsNotFound(err), client.IsCode(err, api.CodeNotFound):
		return exitNotFound
	case client.IsCode(err, api.CodeUnauthorized):
		return exitUnauthorized
	}
	return exitError
}

func (c *ctl) connect(kubeconfig, namespace string) error {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if kubeconfig != "" {
		rules.ExplicitPath = kubeconfig
	}
	cc := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{})
	rc, err := cc.ClientConfig()
	if err != nil {
		return fail(exitError, "kubeconfig: %v", err)
	}
	c.namespace = namespace
	if c.namespace == "" {
		if c.namespace, _, err = cc.Namespace(); err != nil {
			return err
		}
	}
	// kubectl's rates: run --count creates many pods at once.
	rc.QPS, rc.Burst = 50, 300
	c.kube, err = kubernetes.NewForConfig(rc)
	return err
}

func (c *ctl) dispatch(ctx context.Context, cmd string, args []string) error {
	switch cmd {
	case "run":
		return c.run(ctx, args)
	case "exec":
		return c.exec(ctx, args)
	case "cp":
		return c.cp(ctx, args)
	case "ls":
		return c.ls(ctx, args)
	case "rm":
		return c.rm(ctx, args)
	case "renew":
		return c.renew(ctx, args)
	case "get":
		return c.get(ctx, args)
	case "delete":
		return c.delete(ctx, args)
	case "prepull":
		return c.prepull(ctx, args)
	case "images":
		return c.images(ctx, args)
	case "top":
		return c.top(ctx, args)
	case "snapshot":
		return c.snapshot(ctx, args)
	}
	return fail(exitUsage, "unknown command %q (run sandmanctl without arguments for the list)", cmd)
}

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
	boxes, err := c.createSandboxes(ctx, pod, *count)
	if err != nil {
		return err
	}
	var waitErr error
	if *wait > 0 {
		waitErr = c.waitAllReady(ctx, boxes, podcontract.LabelRun+"="+id, *wait)
	}
	for _, b := range boxes {
		if b.err == nil {
			fmt.Fprintf(c.out, "%s\t%s\n", b.name, b.tokenFile)
		}
	}
	return waitErr
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

func newToken() (string, error) {
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

func (c *ctl) tokenFile(name string) string { return filepath.Join(c.tokenDir, c.namespace, name) }

func (c *ctl) saveToken(name, token string) (string, error) {
	f := c.tokenFile(name)
	if err := os.MkdirAll(filepath.Dir(f), 0o700); err != nil {
		return "", err
	}
	return f, os.WriteFile(f, []byte(token+"\n"), 0o600)
}

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

func ready(pod *corev1.Pod) bool {
	for _, cond := range pod.Status.Conditions {
		if cond.Type == corev1.PodReady {
			return cond.Status == corev1.ConditionTrue
		}
	}
	return false
}

func waitingReason(pod *corev1.Pod) string {
	for _, cs := range pod.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			return fmt.Sprintf(": %s: %s", w.Reason, w.Message)
		}
	}
	for _, cond := range pod.Status.Conditions {
		if cond.Status == corev1.ConditionFalse && cond.Message != "" {
			return fmt.Sprintf(": %s: %s", cond.Reason, cond.Message)
		}
	}
	return ""
}

// daemon returns a client for a sandbox's daemon with its token.
func (c *ctl) daemon(ctx context.Context, name string) (*client.Client, error) {
	pod, err := c.kube.CoreV1().Pods(c.namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if apierrors.IsNotFound(err) {
			return nil, fail(exitNotFound, "no sandbox %s in namespace %s", name, c.namespace)
		}
		return nil, err
	}
	if pod.Status.PodIP == "" || !ready(pod) {
		return nil, fail(exitError, "sandbox %s is not ready (%s)%s", name, pod.Status.Phase, waitingReason(pod))
	}
	token := c.token
	if token == "" {
		b, err := os.ReadFile(c.tokenFile(name))
		if err != nil {
			return nil, fail(exitUnauthorized, "no token for %s: %v (give --token or $SANDMAN_TOKEN)", name, err)
		}
		token = strings.TrimSpace(string(b))
	}
	return client.New(pod.Status.PodIP+":49983", client.WithToken(token))
}

// exec streams a command's output and returns its exit code.
func (c *ctl) exec(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("exec", flag.ContinueOnError)
	fs.SetOutput(c.errw)
	timeout := fs.Int("timeout", 0, "seconds before the command (and its children) is killed")
	cwd := fs.String("cwd", "", "working directory")
	stdin := fs.Bool("i", false, "pass stdin to the command")
	if err := fs.Parse(args); err != nil {
		return cliError{code: exitUsage}
	}
	rest := fs.Args()
	if len(rest) < 2 {
		return fail(exitUsage, "exec: give NAME -- CMD...")
	}
	name, cmd := rest[0], rest[1:]
	if cmd[0] == "--" {
		cmd = cmd[1:]
	}
	if len(cmd) == 0 {
		return fail(exitUsage, "exec: no command after --")
	}
	d, err := c.daemon(ctx, name)
	if err != nil {
		return err
	}
	req := api.ExecRequest{Cmd: cmd, Cwd: *cwd, TimeoutSeconds: float64(*timeout)}
	if *stdin {
		b, err := io.ReadAll(os.Stdin)
		if err != nil {
			return err
		}
		req.Stdin = b
	}
	stream, err := d.ExecStream(ctx, req)
	if err != nil {
		return err
	}
	defer stream.Close()
	for {
		ev, err := stream.Next()
		if err != nil {
			return fail(exitError, "exec in %s: the stream ended early: %v", name, err)
		}
		switch ev.Type {
		case api.EventStdout:
			_, _ = c.out.Write(ev.Data)
		case api.EventStderr:
			_, _ = c.errw.Write(ev.Data)
		case api.EventExit:
			code := 0
			if ev.ExitCode != nil {
				code = *ev.ExitCode
			}
			if ev.TimedOut {
				fmt.Fprintf(c.errw, "sandmanctl: the command timed out after %ds and was killed\n", *timeout)
			}
			if code != 0 {
				return cliError{code: code}
			}
			return nil
		case api.EventError:
			if ev.Error != nil {
				return fail(exitError, "exec in %s: %s", name, ev.Error.Message)
			}
		}
	}
}

// splitRemote splits NAME:/path; ok is false for a local path.
func splitRemote(s string) (name, path string, ok bool) {
	name, path, ok = strings.Cut(s, ":")
	if !ok || name == "" || !strings.HasPrefix(path, "/") || strings.Contains(name, "/") {
		return "", s, false
	}
	return name, path, true
}

func (c *ctl) cp(ctx context.Context, args []string) error {
	if len(args) != 2 {
		return fail(exitUsage, "cp: give SRC DST (NAME:/path for a sandbox path)")
	}
	sName, sPath, sRemote := splitRemote(args[0])
	dName, dPath, dRemote := splitRemote(args[1])
	switch {
	case sRemote == dRemote:
		return fail(exitUsage, "cp: exactly one of SRC and DST must be a sandbox path (NAME:/path)")
	case dRemote: // upload
		d, err := c.daemon(ctx, dName)
		if err != nil {
			return err
		}
		fi, err := os.Stat(sPath)
		if err != nil {
			return fail(exitNotFound, "cp: %v", err)
		}
		if fi.IsDir() {
			pr, pw := io.Pipe()
			go func() { _ = pw.CloseWithError(archive.Write(pw, sPath)) }()
			_, err = d.UploadTar(ctx, dPath, pr)
			return err
		}
		f, err := os.Open(sPath)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = d.WriteFile(ctx, dPath, f, fi.Mode().Perm())
		return err
	default: // download
		d, err := c.daemon(ctx, sName)
		if err != nil {
			return err
		}
		st, err := d.Stat(ctx, sPath)
		if err != nil {
			return err
		}
		if st.Type == "dir" {
			r, err := d.DownloadTar(ctx, sPath)
			if err != nil {
				return err
			}
			defer r.Close()
			_, err = archive.Extract(r, dPath)
			return err
		}
		r, err := d.ReadFile(ctx, sPath)
		if err != nil {
			return err
		}
		defer r.Close()
		if fi, err := os.Stat(dPath); err == nil && fi.IsDir() {
			dPath = filepath.Join(dPath, filepath.Base(sPath))
		}
		f, err := os.OpenFile(dPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, r); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
}

func (c *ctl) ls(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return fail(exitUsage, "ls: give NAME:/path")
	}
	name, path, ok := splitRemote(args[0])
	if !ok {
		return fail(exitUsage, "ls: %q is not NAME:/path", args[0])
	}
	d, err := c.daemon(ctx, name)
	if err != nil {
		return err
	}
	list, err := d.List(ctx, path, 1)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	for _, e := range list.Entries {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", e.Mode, e.Size, e.ModTime.Format(time.DateTime), e.Name)
	}
	return tw.Flush()
}

func (c *ctl) rm(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("rm", flag.ContinueOnError)
	fs.SetOutput(c.errw)
	recursive := fs.Bool("r", false, "remove directories and their contents")
	if err := fs.Parse(args); err != nil || fs.NArg() != 1 {
		return fail(exitUsage, "rm: give [-r] NAME:/path")
	}
	name, path, ok := splitRemote(fs.Arg(0))
	if !ok {
		return fail(exitUsage, "rm: %q is not NAME:/path", fs.Arg(0))
	}
	d, err := c.daemon(ctx, name)
	if err != nil {
		return err
	}
	return d.Remove(ctx, path, *recursive)
}

func (c *ctl) renew(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return fail(exitUsage, "renew: give NAME")
	}
	d, err := c.daemon(ctx, args[0])
	if err != nil {
		return err
	}
	return d.Renew(ctx)
}

func (c *ctl) delete(ctx context.Context, args []string) error {
	if len(args) != 1 {
		return fail(exitUsage, "delete: give NAME")
	}
	if err := c.kube.CoreV1().Pods(c.namespace).Delete(ctx, args[0], metav1.DeleteOptions{}); err != nil {
		return err
	}
	_ = os.Remove(c.tokenFile(args[0]))
	return nil
}

// get lists sandboxes (pods with a sandman.io/token-sha256 annotation or on
// a virtual node) with their idle time from the daemon's health.
func (c *ctl) get(ctx context.Context, args []string) error {
	pods, err := c.kube.CoreV1().Pods(c.namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(c.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tNODE\tPHASE\tIP\tAGE\tIDLE")
	found := false
	for _, pod := range pods.Items {
		if len(args) > 0 && pod.Name != args[0] {
			continue
		}
		if pod.Spec.NodeSelector[podcontract.LabelPool] == "" && pod.Annotations[podcontract.AnnotationTokenSHA256] == "" {
			continue
		}
		found = true
		idle := "-"
		if ready(&pod) && pod.Status.PodIP != "" {
			if d, err := client.New(pod.Status.PodIP+":49983", client.WithRetries(0)); err == nil {
				hctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				if h, err := d.Health(hctx); err == nil {
					idle = duration.HumanDuration(time.Duration(h.IdleSeconds * float64(time.Second)))
					if h.Running > 0 {
						idle = fmt.Sprintf("busy (%d running)", h.Running)
					}
				}
				cancel()
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", pod.Name, orDash(pod.Spec.NodeName), pod.Status.Phase, orDash(pod.Status.PodIP),
			duration.HumanDuration(time.Since(pod.CreationTimestamp.Time)), idle)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(args) > 0 && !found {
		return fail(exitNotFound, "no sandbox %s in namespace %s", args[0], c.namespace)
	}
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// Command e2e-trainer does what a trainer does, as an ordinary pod in the
// cluster, for the end-to-end tests: it creates -n sandbox pods on a pool
// (owned by its own pod, so they are garbage-collected with it), waits until
// they are Ready, and through each sandbox's daemon runs a command, writes a
// file, reads it back, moves it and stats and lists the new path. It prints
// one JSON line,
//
//	{"sandboxes":N,"ok":N,"failed":["<pod>: <error>",...],"create_to_ready_ms":{"p50":..,"p99":..}}
//
// and exits 0 only if every sandbox passed. With -wait-after it then waits
// for SIGTERM, so a test can delete its Job and watch the sandboxes go. It
// never deletes the sandboxes itself.
//
// It needs POD_NAME and POD_UID from the downward API and a service account
// that may create, get, list and watch pods in its namespace.
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
	"github.com/sandman-dev/sandman/podcontract"
)

const (
	nsFile     = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
	parallel   = 8
	checkLimit = 2 * time.Minute
)

type options struct {
	n         int
	image     string
	pool      string
	namespace string
	timeout   time.Duration
	waitAfter bool
	podName   string
	podUID    string
}

// summary is the JSON line printed at the end.
type summary struct {
	Sandboxes       int      `json:"sandboxes"`
	OK              int      `json:"ok"`
	Failed          []string `json:"failed"` // "<pod>: <what failed>"
	CreateToReadyMS struct {
		P50 int64 `json:"p50"`
		P99 int64 `json:"p99"`
	} `json:"create_to_ready_ms"`
}

// sandbox is one sandbox pod as the trainer follows it. Each phase (create,
// wait, check) writes a sandbox from one goroutine; the next phase reads it
// after the previous one's Wait, so no lock is needed.
type sandbox struct {
	name    string
	created time.Time // when the create call was made
	ready   time.Time // when it was first seen Ready with an IP
	ip      string
	status  string // last seen phase and reason, for messages
	err     error
}

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	o := options{podName: os.Getenv("POD_NAME"), podUID: os.Getenv("POD_UID")}
	flag.IntVar(&o.n, "n", 20, "number of sandboxes")
	flag.StringVar(&o.image, "image", "", "sandbox image (required)")
	flag.StringVar(&o.pool, "pool", "", "pool: the sandman.io/pool node selector (required)")
	flag.StringVar(&o.namespace, "namespace", "", "namespace of the sandboxes (default: the pod's own)")
	flag.DurationVar(&o.timeout, "timeout", 3*time.Minute, "how long to wait for every sandbox to be Ready")
	flag.BoolVar(&o.waitAfter, "wait-after", false, "after the summary, wait for SIGTERM before exiting")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	sum, err := setupAndRun(ctx, log, o)
	code := 0
	if err != nil {
		log.Error("trainer failed", "err", err)
		code = 1
	}
	if sum != nil {
		_ = json.NewEncoder(os.Stdout).Encode(sum)
		if sum.OK != sum.Sandboxes {
			code = 1
		}
	}
	if o.waitAfter {
		log.Info("waiting for SIGTERM", "exit_code", code)
		<-ctx.Done()
	}
	os.Exit(code)
}

func setupAndRun(ctx context.Context, log *slog.Logger, o options) (*summary, error) {
	if o.image == "" || o.pool == "" || o.podName == "" || o.n < 1 {
		return nil, errors.New("need -image, -pool, -n >= 1 and POD_NAME (downward API)")
	}
	if o.namespace == "" {
		b, err := os.ReadFile(nsFile)
		if err != nil {
			return nil, fmt.Errorf("own namespace: %w (or pass -namespace)", err)
		}
		o.namespace = strings.TrimSpace(string(b))
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("in-cluster config: %w", err)
	}
	cfg.QPS, cfg.Burst = 50, 100
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	pods := kube.CoreV1().Pods(o.namespace)
	if o.podUID == "" {
		self, err := pods.Get(ctx, o.podName, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("own pod (for its UID; or set POD_UID): %w", err)
		}
		o.podUID = string(self.UID)
	}
	return run(ctx, log, pods, o)
}

func run(ctx context.Context, log *slog.Logger, pods typedcorev1.PodInterface, o options) (*summary, error) {
	var raw [16]byte
	_, _ = rand.Read(raw[:])
	token := hex.EncodeToString(raw[:])
	hash := sha256.Sum256([]byte(token))

	// Create the sandboxes.
	sbs := make([]*sandbox, o.n)
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(parallel)
	for i := range sbs {
		sb := &sandbox{}
		sbs[i] = sb
		g.Go(func() error {
			sb.created = time.Now()
			p, err := pods.Create(gctx, sandboxPod(o, hex.EncodeToString(hash[:])), metav1.CreateOptions{})
			if err != nil {
				sb.name, sb.err = fmt.Sprintf("#%d", i), fmt.Errorf("create: %w", err)
				return nil
			}
			sb.name = p.Name
			return nil
		})
	}
	_ = g.Wait()
	log.Info("sandboxes created", "n", o.n, "namespace", o.namespace, "pool", o.pool, "image", o.image)

	// Wait until each is Ready, has failed, or the timeout passes.
	wctx, cancel := context.WithTimeout(ctx, o.timeout)
	werr := waitReady(wctx, pods, podcontract.LabelJob+"="+o.podName, sbs)
	cancel()
	for _, sb := range sbs {
		if sb.err == nil && sb.ready.IsZero() {
			sb.err = fmt.Errorf("not Ready after %s (%s): %v", o.timeout, sb.status, werr)
		}
	}
	log.Info("sandboxes waited for", "ready", countReady(sbs))

	// Use each Ready sandbox through its daemon.
	g, gctx = errgroup.WithContext(ctx)
	g.SetLimit(parallel)
	for _, sb := range sbs {
		if sb.err != nil {
			continue
		}
		g.Go(func() error {
			cctx, cancel := context.WithTimeout(gctx, checkLimit)
			defer cancel()
			sb.err = check(cctx, sb, token)
			return nil
		})
	}
	_ = g.Wait()
	return summarize(sbs), ctx.Err()
}

func sandboxPod(o options, tokenHash string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: o.podName + "-sb-",
			Labels:       map[string]string{podcontract.LabelJob: o.podName},
			Annotations:  map[string]string{podcontract.AnnotationTokenSHA256: tokenHash},
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Pod", Name: o.podName, UID: types.UID(o.podUID),
				BlockOwnerDeletion: new(false),
			}},
		},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{podcontract.LabelPool: o.pool},
			Tolerations: []corev1.Toleration{{
				Key: podcontract.LabelPool, Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule,
			}},
			Containers: []corev1.Container{{Name: "task", Image: o.image}},
		},
	}
}

// waitReady follows the job's pods (list, then watch; a closed watch is
// listed again) until every sandbox in sbs is Ready with an IP or has
// failed, or ctx ends.
func waitReady(ctx context.Context, pods typedcorev1.PodInterface, selector string, sbs []*sandbox) error {
	byName := map[string]*sandbox{}
	for _, sb := range sbs {
		if sb.err == nil {
			byName[sb.name] = sb
		}
	}
	pending := func() bool {
		return slices.ContainsFunc(sbs, func(sb *sandbox) bool { return sb.err == nil && sb.ready.IsZero() })
	}
	for pending() {
		list, err := pods.List(ctx, metav1.ListOptions{LabelSelector: selector})
		if err != nil {
			return err
		}
		for i := range list.Items {
			observe(byName[list.Items[i].Name], &list.Items[i], false)
		}
		if !pending() {
			return nil
		}
		w, err := pods.Watch(ctx, metav1.ListOptions{LabelSelector: selector, ResourceVersion: list.ResourceVersion})
		if err != nil {
			return err
		}
		for ev := range w.ResultChan() {
			if p, ok := ev.Object.(*corev1.Pod); ok {
				observe(byName[p.Name], p, ev.Type == watch.Deleted)
			}
			if !pending() {
				break
			}
		}
		w.Stop()
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// observe updates sb (nil: not ours) from a seen state of its pod.
func observe(sb *sandbox, p *corev1.Pod, deleted bool) {
	if sb == nil || sb.err != nil || !sb.ready.IsZero() {
		return
	}
	sb.status = string(p.Status.Phase)
	if p.Status.Reason != "" {
		sb.status += " " + p.Status.Reason
	}
	for _, cs := range p.Status.ContainerStatuses {
		if cs.State.Waiting != nil && cs.State.Waiting.Reason != "" {
			sb.status += ", " + cs.State.Waiting.Reason + ": " + cs.State.Waiting.Message
		}
	}
	switch {
	case deleted:
		sb.err = errors.New("deleted before it was Ready")
	case p.Status.Phase == corev1.PodFailed || p.Status.Phase == corev1.PodSucceeded:
		sb.err = fmt.Errorf("pod ended (%s): %s", sb.status, p.Status.Message)
	case podReady(p) && p.Status.PodIP != "":
		sb.ready, sb.ip = time.Now(), p.Status.PodIP
	}
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// check uses one sandbox as a trainer would: a command, then a file written,
// read back, moved, and found at its new path only.
func check(ctx context.Context, sb *sandbox, token string) error {
	c, err := client.New(net.JoinHostPort(sb.ip, strconv.Itoa(api.Port)), client.WithToken(token))
	if err != nil {
		return err
	}
	res, err := c.Exec(ctx, api.ExecRequest{Cmd: []string{"sh", "-c", `echo "hello-$(cat /proc/sys/kernel/hostname)"`}})
	if err != nil {
		return fmt.Errorf("exec: %w", err)
	}
	if want := "hello-" + sb.name + "\n"; res.ExitCode != 0 || string(res.Stdout) != want {
		return fmt.Errorf("exec: exit %d, stdout %q, stderr %q; want exit 0, stdout %q", res.ExitCode, res.Stdout, res.Stderr, want)
	}

	const dir, from, to = "/tmp/trainer", "/tmp/trainer/in.txt", "/tmp/trainer/moved/out.txt"
	content := []byte("written by the trainer to " + sb.name + "\n")
	if _, err := c.WriteFile(ctx, from, bytes.NewReader(content), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", from, err)
	}
	rc, err := c.ReadFile(ctx, from)
	if err != nil {
		return fmt.Errorf("read %s: %w", from, err)
	}
	got, err := io.ReadAll(rc)
	rc.Close()
	if err != nil || !bytes.Equal(got, content) {
		return fmt.Errorf("read %s: got %q (%v), want %q", from, got, err, content)
	}
	if _, err := c.Move(ctx, from, to, false); err != nil {
		return fmt.Errorf("move %s to %s: %w", from, to, err)
	}
	fi, err := c.Stat(ctx, to)
	if err != nil {
		return fmt.Errorf("stat %s: %w", to, err)
	}
	if fi.Type != "file" || fi.Size != int64(len(content)) {
		return fmt.Errorf("stat %s: %s of %d bytes, want a file of %d", to, fi.Type, fi.Size, len(content))
	}
	list, err := c.List(ctx, dir+"/moved", 1)
	if err != nil {
		return fmt.Errorf("list %s/moved: %w", dir, err)
	}
	if !slices.ContainsFunc(list.Entries, func(e api.FileInfo) bool { return e.Name == "out.txt" }) {
		return fmt.Errorf("list %s/moved: no out.txt in %d entries", dir, len(list.Entries))
	}
	if _, err := c.Stat(ctx, from); !client.IsNotFound(err) {
		return fmt.Errorf("stat %s after the move: want not found, got %v", from, err)
	}
	return nil
}

func countReady(sbs []*sandbox) int {
	n := 0
	for _, sb := range sbs {
		if !sb.ready.IsZero() {
			n++
		}
	}
	return n
}

func summarize(sbs []*sandbox) *summary {
	s := &summary{Sandboxes: len(sbs), Failed: []string{}}
	var ms []int64
	for _, sb := range sbs {
		if !sb.ready.IsZero() {
			ms = append(ms, sb.ready.Sub(sb.created).Milliseconds())
		}
		if sb.err != nil {
			s.Failed = append(s.Failed, sb.name+": "+sb.err.Error())
			continue
		}
		s.OK++
	}
	slices.Sort(ms)
	s.CreateToReadyMS.P50 = percentile(ms, 50)
	s.CreateToReadyMS.P99 = percentile(ms, 99)
	return s
}

// percentile is the nearest-rank percentile of sorted values (0 when empty).
func percentile(sorted []int64, p int) int64 {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted)*p + 99) / 100
	return sorted[max(i-1, 0)]
}

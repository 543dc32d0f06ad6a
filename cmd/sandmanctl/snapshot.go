package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/containerd/errdefs"
	"golang.org/x/term"

	"github.com/sandman-dev/sandman/runtime"
	vkapi "github.com/sandman-dev/sandman/vk/api"
	vkclient "github.com/sandman-dev/sandman/vk/client"
)

const snapshotUsage = "usage: sandmanctl snapshot [--container C] [--timeout D] POD IMAGE"

// snapshot commits a bound sandbox's filesystem changes as a new image in
// the pool's snapshot registry, showing its progress on stderr, and prints
// IMAGE@DIGEST on stdout.
func (c *ctl) snapshot(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("snapshot", flag.ContinueOnError)
	fs.SetOutput(c.errw)
	container := fs.String("container", "", "the container to snapshot (default: the pod's only one)")
	timeout := fs.Duration("timeout", 30*time.Minute, "give up (and cancel the snapshot) after this long")
	if err := fs.Parse(args); err != nil {
		return cliError{code: exitUsage}
	}
	if fs.NArg() != 2 {
		return fail(exitUsage, "%s", snapshotUsage)
	}
	pod, image := fs.Arg(0), fs.Arg(1)
	if *timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, *timeout)
		defer cancel()
	}
	rc := c.kube.CoreV1().RESTClient()
	node, err := vkclient.PodNode(ctx, rc, c.namespace, pod)
	if err != nil {
		return snapshotFailed(err)
	}
	p := &snapshotProgress{out: c.errw, tty: isTerminal(c.errw)}
	res, err := vkclient.Snapshot(ctx, rc, node, vkapi.SnapshotRequest{Namespace: c.namespace, Pod: pod, Container: *container, Image: image}, p.show)
	p.end()
	if err != nil {
		return snapshotFailed(err)
	}
	fmt.Fprintln(c.errw, snapshotSummary(c.namespace+"/"+pod, node, res))
	fmt.Fprintf(c.out, "%s@%s\n", res.Image, res.Digest)
	return nil
}

// snapshotFailed gives a failed snapshot its exit code: 3 when the pod is
// not found, else 1.
func snapshotFailed(err error) error {
	code := exitError
	if errors.Is(err, errdefs.ErrNotFound) {
		code = exitNotFound
	}
	return cliError{code: code, err: fmt.Errorf("snapshot: %w", err)}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// snapshotProgress shows a snapshot's stream: on a terminal one line
// rewritten in place, otherwise a line when the phase changes.
type snapshotProgress struct {
	out   io.Writer
	tty   bool
	phase runtime.SnapshotPhase
	drawn bool
}

func (p *snapshotProgress) show(l vkapi.SnapshotLine) {
	text := progressText(l)
	if p.tty {
		fmt.Fprintf(p.out, "\r\x1b[2K%s", text)
		p.drawn = true
		return
	}
	if l.Phase != p.phase {
		p.phase = l.Phase
		fmt.Fprintln(p.out, text)
	}
}

// end leaves the rewritten line behind.
func (p *snapshotProgress) end() {
	if p.drawn {
		fmt.Fprintln(p.out)
		p.drawn = false
	}
}

// progressText is one progress line: phase, MB done (of total), elapsed.
func progressText(l vkapi.SnapshotLine) string {
	elapsed := (time.Duration(l.ElapsedMS) * time.Millisecond).Round(100 * time.Millisecond)
	where := ""
	if l.Node != "" {
		where = " on " + l.Node
	}
	var bytes string
	switch {
	case l.BytesTotal > 0:
		bytes = fmt.Sprintf("  %s / %s (%.0f%%)", mb(l.BytesDone), mb(l.BytesTotal), 100*float64(l.BytesDone)/float64(l.BytesTotal))
	case l.BytesDone > 0:
		bytes = "  " + mb(l.BytesDone)
	}
	what := string(l.Phase)
	switch l.Phase {
	case vkapi.SnapshotQueued:
		what = "queued (the worker takes other snapshots)"
	case runtime.SnapshotFreeze:
		what = "freeze (pausing the sandbox)"
	case runtime.SnapshotDiff:
		what = "diff (writing the changes)"
	case runtime.SnapshotCommit:
		what = "commit (sandbox running again; compressing the layer)"
	case runtime.SnapshotPush:
		what = "push"
	}
	return fmt.Sprintf("snapshot%s: %s%s  %v", where, what, bytes, elapsed)
}

func mb(n int64) string { return fmt.Sprintf("%.1f MB", float64(n)/1e6) }

// snapshotSummary is the line said once the snapshot is pushed.
func snapshotSummary(pod, node string, r runtime.SnapshotResult) string {
	return fmt.Sprintf("snapshot of %s on %s: %s of changes as a %s layer, frozen %d ms, %v in all",
		pod, node, mb(r.DiffBytes), mb(r.LayerBytes), r.Frozen.Milliseconds(), r.Duration.Round(100*time.Millisecond))
}

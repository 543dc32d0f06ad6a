package vk

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"

	vkerrdefs "github.com/virtual-kubelet/virtual-kubelet/errdefs"
	"github.com/virtual-kubelet/virtual-kubelet/node/api"
	"github.com/virtual-kubelet/virtual-kubelet/node/nodeutil"
	utilexec "k8s.io/utils/exec"

	daemonapi "github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
)

// The kubelet API of the virtual node: kubectl exec, attach and logs reach
// the sandbox's daemon with the control plane's own per-sandbox token, never
// a trainer's; stats come from the node agents (stats.go).

var _ nodeutil.Provider = (*Provider)(nil)

// daemonFor returns clients for the daemon serving one container of a
// running sandbox: one per control key to try, in order (callDaemon tries
// them), or one without a token for an unauthenticated sandbox.
func (p *Provider) daemonFor(namespace, podName, container string) ([]*client.Client, error) {
	p.mu.Lock()
	sb := p.byUID[p.byKey[podKey(namespace, podName)]]
	var ip, uid string
	var known []byte
	index := -1
	if sb != nil {
		ip, uid, known = sb.slot.IP, string(sb.pod.UID), sb.controlKey
		for i, c := range sb.pod.Spec.Containers {
			if c.Name == container || container == "" && i == 0 {
				index = i
			}
		}
	}
	running := sb != nil && sb.started() && !sb.terminal()
	authed := sb != nil && len(sb.req.TokenHashes) > 0
	p.mu.Unlock()
	switch {
	case sb == nil:
		return nil, vkerrdefs.NotFoundf("pod %s/%s is not on virtual node %s", namespace, podName, p.cfg.NodeName)
	case index < 0:
		return nil, vkerrdefs.NotFoundf("pod %s/%s has no container %q", namespace, podName, container)
	case !running || ip == "":
		return nil, vkerrdefs.InvalidInputf("pod %s/%s is not running", namespace, podName)
	}
	addr := ip + ":" + strconv.Itoa(daemonapi.Port+index)
	if !authed {
		c, err := client.New(addr, client.WithHTTPClient(p.daemonHTTP))
		return []*client.Client{c}, err
	}
	if p.cfg.ControlKeys == nil {
		return nil, vkerrdefs.InvalidInputf("virtual node %s has no control key, so it holds no token for the sandbox of %s/%s", p.cfg.NodeName, namespace, podName)
	}
	return p.daemonClients(addr, uid, known, -1)
}

// daemonClients are clients for the daemon at addr of pod uid, one per
// control key in the order to try them (keySet.tryOrder), with retries
// (negative: the client's default).
func (p *Provider) daemonClients(addr, uid string, known []byte, retries int) ([]*client.Client, error) {
	keys := p.cfg.ControlKeys.set.Load().tryOrder(known)
	out := make([]*client.Client, 0, len(keys))
	for _, k := range keys {
		opts := []client.Option{client.WithHTTPClient(p.daemonHTTP), client.WithToken(ControlToken(k, uid))}
		if retries >= 0 {
			opts = append(opts, client.WithRetries(retries))
		}
		c, err := client.New(addr, opts...)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// callDaemon calls call with each client in turn until the daemon does not
// refuse its token (401), and returns the client it accepted (nil if it
// refused them all) and call's last error. A refusal comes before a call
// does anything (an attach's stdin is read only once the stream is open),
// so trying again with the next key is safe.
func callDaemon(clients []*client.Client, call func(*client.Client) error) (*client.Client, error) {
	var err error
	for _, c := range clients {
		if err = call(c); !client.IsCode(err, daemonapi.CodeUnauthorized) {
			return c, err
		}
	}
	return nil, err
}

// callPod calls call on the daemon of a pod's container with each control
// key in turn (daemonFor, callDaemon). When every key is refused it asks
// once more with the keys of now: a re-key may have landed between taking
// the keys and the call, moving the daemon to a key that was not held yet.
// It returns the client the daemon took and the clients of the last try.
func (p *Provider) callPod(namespace, podName, container string, call func(*client.Client) error) (*client.Client, []*client.Client, error) {
	clients, err := p.daemonFor(namespace, podName, container)
	if err != nil {
		return nil, nil, err
	}
	c, err := callDaemon(clients, call)
	if client.IsCode(err, daemonapi.CodeUnauthorized) {
		if again, aerr := p.daemonFor(namespace, podName, container); aerr == nil {
			clients = again
			c, err = callDaemon(clients, call)
		}
	}
	return c, clients, err
}

// RunInContainer implements nodeutil.Provider (kubectl exec): the command
// runs through the daemon's attach endpoint, on a terminal with -t, with
// stdin with -i; its exit code comes back as kubectl's.
func (p *Provider) RunInContainer(ctx context.Context, namespace, podName, containerName string, cmd []string, attach api.AttachIO) error {
	if err := p.resumeForCall(ctx, namespace, podName); err != nil {
		return err
	}
	if _, err := p.daemonFor(namespace, podName, containerName); err != nil {
		return err
	}
	opts := client.AttachOptions{Cmd: cmd, TTY: attach.TTY(), Stdout: io.Discard, Stderr: io.Discard}
	if in := attach.Stdin(); in != nil {
		opts.Stdin = in
	}
	if out := attach.Stdout(); out != nil {
		opts.Stdout = out
		defer out.Close()
	}
	if errw := attach.Stderr(); errw != nil {
		opts.Stderr = errw
		defer errw.Close()
	}
	if attach.TTY() {
		resize := make(chan client.TermSize, 1)
		opts.Resize = resize
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case s, ok := <-attach.Resize():
					if !ok {
						return
					}
					select {
					case resize <- client.TermSize{Width: s.Width, Height: s.Height}:
					case <-ctx.Done():
						return
					}
				}
			}
		}()
	}
	var code int
	_, _, err := p.callPod(namespace, podName, containerName, func(c *client.Client) error {
		var err error
		code, err = c.Attach(ctx, opts)
		return err
	})
	if err != nil {
		return fmt.Errorf("exec in %s/%s: %w", namespace, podName, err)
	}
	if code != 0 {
		return utilexec.CodeExitError{Err: fmt.Errorf("command terminated with exit code %d", code), Code: code}
	}
	return nil
}

// AttachToContainer implements nodeutil.Provider. The main process's
// terminal is not shared; kubectl attach gets a clear refusal.
func (p *Provider) AttachToContainer(ctx context.Context, namespace, podName, containerName string, attach api.AttachIO) error {
	return vkerrdefs.InvalidInputf("kubectl attach is not supported by virtual node %s: use kubectl logs -f for the main process's output, or kubectl exec", p.cfg.NodeName)
}

// PortForward implements nodeutil.Provider.
func (p *Provider) PortForward(ctx context.Context, namespace, pod string, port int32, stream io.ReadWriteCloser) error {
	return vkerrdefs.InvalidInputf("kubectl port-forward is not supported by virtual node %s: reach the pod IP directly", p.cfg.NodeName)
}

// GetContainerLogs implements nodeutil.Provider (kubectl logs): the main
// process's output as the daemon keeps it, with --tail, --since,
// --timestamps, --limit-bytes and -f.
func (p *Provider) GetContainerLogs(ctx context.Context, namespace, podName, containerName string, opts api.ContainerLogOpts) (io.ReadCloser, error) {
	since := logSince(opts, time.Now())
	// The backlog first (it ends at the output's current end); the follow
	// uses the client whose token the daemon took.
	var backlog []byte
	var end int64
	c, clients, err := p.callPod(namespace, podName, containerName, func(c *client.Client) error {
		var err error
		backlog, end, err = readMain(ctx, c, 0, false, since, opts.Timestamps)
		return err
	})
	if err != nil {
		if client.IsCode(err, daemonapi.CodeNotFound) {
			// No command: the sandbox has no main process and no logs.
			return io.NopCloser(bytes.NewReader(nil)), nil
		}
		return nil, err
	}
	if opts.Tail > 0 {
		backlog = lastLines(backlog, opts.Tail)
	}
	if !opts.Follow {
		return limit(io.NopCloser(bytes.NewReader(backlog)), opts.LimitBytes), nil
	}
	pr, pw := io.Pipe()
	go func() {
		if _, err := pw.Write(backlog); err != nil {
			return
		}
		var stream *client.EventStream
		// A re-key since the backlog may have moved the sandbox to
		// another key.
		_, err := callDaemon(append([]*client.Client{c}, clients...), func(c *client.Client) error {
			var err error
			stream, err = c.ProcessOutput(ctx, "main", end, true)
			return err
		})
		if err != nil {
			_ = pw.CloseWithError(err)
			return
		}
		defer stream.Close()
		for {
			ev, err := stream.Next()
			if err != nil {
				_ = pw.CloseWithError(ignoreEOF(err))
				return
			}
			if len(ev.Data) == 0 || !since.IsZero() && ev.Time.Before(since) {
				continue
			}
			if _, err := pw.Write(format(ev, opts.Timestamps)); err != nil {
				return
			}
		}
	}()
	return limit(pr, opts.LimitBytes), nil
}

func ignoreEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// readMain reads the main process's output from offset to its current end.
func readMain(ctx context.Context, c *client.Client, offset int64, follow bool, since time.Time, timestamps bool) ([]byte, int64, error) {
	stream, err := c.ProcessOutput(ctx, "main", offset, follow)
	if err != nil {
		return nil, 0, err
	}
	defer stream.Close()
	var out []byte
	end := offset
	for {
		ev, err := stream.Next()
		if errors.Is(err, io.EOF) {
			return out, end, nil
		}
		if err != nil {
			return nil, 0, err
		}
		if len(ev.Data) == 0 {
			continue
		}
		end = ev.Offset + int64(len(ev.Data))
		if !since.IsZero() && ev.Time.Before(since) {
			continue
		}
		out = append(out, format(ev, timestamps)...)
	}
}

// format renders an output chunk, each line prefixed with its time when
// asked (as kubelet does: RFC3339Nano and a space).
func format(ev daemonapi.Event, timestamps bool) []byte {
	if !timestamps {
		return ev.Data
	}
	var b bytes.Buffer
	ts := ev.Time.UTC().Format(time.RFC3339Nano) + " "
	// Lines as they are (a \r before the \n stays, as without timestamps).
	for line := range bytes.Lines(ev.Data) {
		b.WriteString(ts)
		b.Write(line)
		if line[len(line)-1] != '\n' {
			b.WriteByte('\n')
		}
	}
	return b.Bytes()
}

// logSince is the earliest output time kubectl logs asks for: --since-time,
// or --since counted back from now; zero for all of the output, also when
// --since reaches back further than a time.Duration holds.
func logSince(opts api.ContainerLogOpts, now time.Time) time.Time {
	if s := opts.SinceSeconds; s > 0 {
		if int64(s) > math.MaxInt64/int64(time.Second) {
			return time.Time{}
		}
		return now.Add(-time.Duration(s) * time.Second)
	}
	return opts.SinceTime
}

// lastLines keeps the last n lines of b.
func lastLines(b []byte, n int) []byte {
	end := len(b)
	if end > 0 && b[end-1] == '\n' {
		end--
	}
	for i := end - 1; i >= 0; i-- {
		if b[i] == '\n' {
			n--
			if n == 0 {
				return b[i+1:]
			}
		}
	}
	return b
}

func limit(r io.ReadCloser, n int) io.ReadCloser {
	if n <= 0 {
		return r
	}
	return struct {
		io.Reader
		io.Closer
	}{io.LimitReader(r, int64(n)), r}
}

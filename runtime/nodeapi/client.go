package nodeapi

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime"
)

var (
	_ runtime.Runtime      = (*Client)(nil)
	_ runtime.Snapshotter  = (*Client)(nil)
	_ runtime.Checkpointer = (*Client)(nil)
	_ runtime.EgressSetter = (*Client)(nil)
)

// Client is a runtime.Runtime served by a node agent.
type Client struct {
	base  string
	token string
	hc    *http.Client
	// epoch, when set, is the caller's leader epoch, sent with every call
	// (HeaderLeaderEpoch) while it is not 0.
	epoch func() uint64
}

// NewClient returns a client for the agent at addr ("host:port" or a URL).
func NewClient(addr, token string, hc *http.Client) *Client {
	if !strings.Contains(addr, "://") {
		addr = "http://" + addr
	}
	if hc == nil {
		hc = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second}}
	}
	return &Client{base: strings.TrimSuffix(addr, "/"), token: token, hc: hc}
}

// NewTLSClient returns a client for the agent at addr ("host:port") over
// mutual TLS (nodetls.ClientCerts.TLSConfig): no token is sent.
func NewTLSClient(addr string, cfg *tls.Config) *Client {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 90 * time.Second,
		TLSClientConfig: cfg, ForceAttemptHTTP2: false}}
	return &Client{base: "https://" + addr, hc: hc}
}

// WithLeaderEpoch makes every call carry the caller's current leader epoch
// (0: none yet, no header). Set it before the client is used.
func (c *Client) WithLeaderEpoch(epoch func() uint64) *Client {
	c.epoch = epoch
	return c
}

// setHeaders adds the token and the leader epoch.
func (c *Client) setHeaders(req *http.Request) {
	if c.token != "" {
		req.Header.Set("Authorization", "Bearer "+c.token)
	}
	if c.epoch != nil {
		if e := c.epoch(); e > 0 {
			req.Header.Set(HeaderLeaderEpoch, strconv.FormatUint(e, 10))
		}
	}
}

func (c *Client) do(ctx context.Context, method, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, body)
	if err != nil {
		return err
	}
	c.setHeaders(req)
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return transportError(ctx, "node agent "+c.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return decodeError(resp)
	}
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return transportError(ctx, "node agent "+c.base+": read answer", err)
	}
	return nil
}

// transportError says why a call got no answer, keeping the cause matchable
// with errors.Is (context.DeadlineExceeded, a *net.OpError, syscall errors).
// A caller that cancelled its own context gets its cancellation back, not a
// verdict on the agent; anything else (refused, reset, timed out) is also
// errdefs.ErrUnavailable.
func transportError(ctx context.Context, what string, err error) error {
	if errors.Is(ctx.Err(), context.Canceled) {
		if !errors.Is(err, context.Canceled) {
			return fmt.Errorf("%s: %w: %w", what, err, context.Canceled)
		}
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("%s: %w: %w", what, err, errdefs.ErrUnavailable)
}

// decodeError turns an error answer back into its errdefs class.
func decodeError(resp *http.Response) error {
	var b errorBody
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if json.Unmarshal(data, &b) != nil || b.Error.Code == "" {
		return fmt.Errorf("node agent answered %s: %s", resp.Status, bytes.TrimSpace(data))
	}
	return fromWire(b.Error)
}

// fromWire is an error from the wire with its errdefs classes.
func fromWire(we wireError) error {
	var classes []error
	for _, code := range append([]string{we.Code}, we.Causes...) {
		for _, c := range codes {
			if c.code == code {
				classes = append(classes, c.err)
			}
		}
	}
	if len(classes) == 0 {
		return fmt.Errorf("node agent: %s", we.Message)
	}
	return remoteError{msg: we.Message, classes: classes}
}

// remoteError keeps the agent's message and its errdefs class.
type remoteError struct {
	msg     string
	classes []error
}

func (e remoteError) Error() string   { return e.msg }
func (e remoteError) Unwrap() []error { return e.classes }

// Bind implements runtime.Runtime.
func (c *Client) Bind(ctx context.Context, req runtime.BindRequest) (runtime.Slot, error) {
	var s runtime.Slot
	err := c.do(ctx, http.MethodPost, "/v1/bind", req, &s)
	return s, err
}

// Release implements runtime.Runtime.
func (c *Client) Release(ctx context.Context, uid string, grace time.Duration) error {
	return c.do(ctx, http.MethodPost, "/v1/release", releaseRequest{UID: uid, GraceSeconds: grace.Seconds()}, nil)
}

// Pause implements runtime.Checkpointer: POST /v1/pause.
func (c *Client) Pause(ctx context.Context, uid string) (runtime.PauseResult, error) {
	var res runtime.PauseResult
	err := c.do(ctx, http.MethodPost, "/v1/pause", podRequest{UID: uid}, &res)
	return res, err
}

// DeleteCheckpoint implements runtime.CheckpointStore: POST
// /v1/checkpoints/delete.
func (c *Client) DeleteCheckpoint(ctx context.Context, pod runtime.PodRef, ref string) error {
	return c.do(ctx, http.MethodPost, "/v1/checkpoints/delete", checkpointRequest{Pod: pod, Ref: ref}, nil)
}

// Move implements runtime.Mover: POST /v1/move.
func (c *Client) Move(ctx context.Context, uid string) (runtime.MovedCheckpoint, error) {
	var res runtime.MovedCheckpoint
	err := c.do(ctx, http.MethodPost, "/v1/move", podRequest{UID: uid}, &res)
	return res, err
}

// Resume implements runtime.Checkpointer: POST /v1/resume.
func (c *Client) Resume(ctx context.Context, uid string) error {
	return c.do(ctx, http.MethodPost, "/v1/resume", podRequest{UID: uid}, nil)
}

// SetEgress implements runtime.EgressSetter: POST /v1/egress.
func (c *Client) SetEgress(ctx context.Context, uid string, e runtime.Egress) error {
	return c.do(ctx, http.MethodPost, "/v1/egress", egressRequest{UID: uid, Egress: e}, nil)
}

// Drain asks the agent to empty its node (runtime.Drainer), saying why;
// it returns when every sandbox is released.
func (c *Client) Drain(ctx context.Context, why string) error {
	return c.do(ctx, http.MethodPost, "/v1/drain", drainRequest{Reason: why}, nil)
}

// Claim tells the agent that the caller leads with its epoch
// (WithLeaderEpoch): from then on it refuses every mutating call of an
// older leader. It fails with ErrStaleLeader when a newer one has claimed
// it already.
func (c *Client) Claim(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/v1/leader", struct{}{}, nil)
}

// Undrain asks the agent to take binds again.
func (c *Client) Undrain(ctx context.Context) error {
	return c.do(ctx, http.MethodPost, "/v1/undrain", struct{}{}, nil)
}

// Inventory implements runtime.Runtime.
func (c *Client) Inventory(ctx context.Context) (runtime.Inventory, error) {
	var inv runtime.Inventory
	err := c.do(ctx, http.MethodGet, "/v1/inventory", nil, &inv)
	return inv, err
}

// Stats implements runtime.Runtime.
func (c *Client) Stats(ctx context.Context, uid string) (runtime.Stats, error) {
	var st runtime.Stats
	err := c.do(ctx, http.MethodGet, "/v1/stats?uid="+url.QueryEscape(uid), nil, &st)
	return st, err
}

// PrePull implements runtime.ImageCache.
func (c *Client) PrePull(ctx context.Context, images []string) error {
	return c.do(ctx, http.MethodPost, "/v1/images/prepull", imagesRequest{Images: images}, nil)
}

// Unpin implements runtime.ImageCache.
func (c *Client) Unpin(ctx context.Context, images []string) error {
	return c.do(ctx, http.MethodPost, "/v1/images/unpin", imagesRequest{Images: images}, nil)
}

// ImageStatuses implements runtime.ImageCache.
func (c *Client) ImageStatuses(ctx context.Context) ([]runtime.ImageStatus, error) {
	var st []runtime.ImageStatus
	err := c.do(ctx, http.MethodGet, "/v1/images", nil, &st)
	return st, err
}

// Watch implements runtime.Runtime. The channel closes when ctx ends, the
// connection breaks, or no heartbeat arrives for three periods.
func (c *Client) Watch(ctx context.Context) (runtime.Inventory, <-chan runtime.Event, error) {
	wctx, cancel := context.WithCancel(ctx)
	req, err := http.NewRequestWithContext(wctx, http.MethodGet, c.base+"/v1/watch", nil)
	if err != nil {
		cancel()
		return runtime.Inventory{}, nil, err
	}
	c.setHeaders(req)
	resp, err := c.hc.Do(req)
	if err != nil {
		cancel()
		return runtime.Inventory{}, nil, transportError(ctx, "watch node agent "+c.base, err)
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		cancel()
		return runtime.Inventory{}, nil, decodeError(resp)
	}
	dec := json.NewDecoder(bufio.NewReaderSize(resp.Body, 64<<10))
	var first watchLine
	if err := dec.Decode(&first); err != nil || first.Inventory == nil {
		resp.Body.Close()
		cancel()
		if err == nil {
			err = errors.New("the stream's first line is not an inventory")
		}
		return runtime.Inventory{}, nil, transportError(ctx, "watch node agent "+c.base+": no inventory first", err)
	}
	events := make(chan runtime.Event, 1024)
	alive := make(chan struct{}, 1)
	go func() {
		// Three missed heartbeats end the watch.
		t := time.NewTimer(3 * Heartbeat)
		defer t.Stop()
		for {
			select {
			case <-alive:
				t.Reset(3 * Heartbeat)
			case <-t.C:
				cancel()
				return
			case <-wctx.Done():
				return
			}
		}
	}()
	go func() {
		defer close(events)
		defer cancel()
		defer resp.Body.Close()
		for {
			var line watchLine
			if err := dec.Decode(&line); err != nil {
				return
			}
			select {
			case alive <- struct{}{}:
			default:
			}
			if line.Event == nil {
				continue
			}
			select {
			case events <- *line.Event:
			case <-wctx.Done():
				return
			}
		}
	}()
	return *first.Inventory, events, nil
}

// Snapshot implements runtime.Snapshotter: POST /v1/snapshot, whose
// answer streams the progress (handed to progress as it comes) and ends
// with the result or the runtime's error, in its errdefs class. An answer
// that ends before either is Unavailable (the agent went away).
func (c *Client) Snapshot(ctx context.Context, req runtime.SnapshotRequest, progress func(runtime.SnapshotProgress)) (runtime.SnapshotResult, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return runtime.SnapshotResult{}, err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, c.base+"/v1/snapshot", bytes.NewReader(b))
	if err != nil {
		return runtime.SnapshotResult{}, err
	}
	c.setHeaders(hreq)
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := c.hc.Do(hreq)
	if err != nil {
		return runtime.SnapshotResult{}, transportError(ctx, "node agent "+c.base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return runtime.SnapshotResult{}, decodeError(resp)
	}
	dec := json.NewDecoder(bufio.NewReader(resp.Body))
	for {
		var line snapshotLine
		if err := dec.Decode(&line); err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return runtime.SnapshotResult{}, transportError(ctx, "node agent "+c.base+": snapshot answer ended before its result", err)
		}
		switch {
		case line.Error != nil:
			return runtime.SnapshotResult{}, fromWire(*line.Error)
		case line.Result != nil:
			return *line.Result, nil
		case line.Progress != nil && progress != nil:
			progress(*line.Progress)
		}
	}
}

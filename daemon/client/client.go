package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sandman-dev/sandman/daemon/api"
)

// Client talks to one sandbox's daemon. It is safe for concurrent use.
type Client struct {
	base    *url.URL
	token   string
	hc      *http.Client
	retries int
	socket  string
}

// Option configures a Client.
type Option func(*Client)

// WithToken sets the bearer token sent with every call.
func WithToken(token string) Option { return func(c *Client) { c.token = token } }

// WithHTTPClient replaces the HTTP client (transport, timeouts).
func WithHTTPClient(hc *http.Client) Option { return func(c *Client) { c.hc = hc } }

// WithRetries sets how often an idempotent call (reads, stat, list, health)
// is retried on a connection error or a 503 (default 3).
func WithRetries(n int) Option { return func(c *Client) { c.retries = n } }

// New returns a client for the daemon at addr: "host:port", an http(s) URL,
// or "unix:///path/to/socket".
func New(addr string, opts ...Option) (*Client, error) {
	c := &Client{retries: 3}
	switch {
	case strings.HasPrefix(addr, "unix://"):
		c.socket = strings.TrimPrefix(addr, "unix://")
		addr = "http://sandbox"
	case !strings.Contains(addr, "://"):
		addr = "http://" + addr
	}
	u, err := url.Parse(addr)
	if err != nil {
		return nil, fmt.Errorf("daemon address %q: %w", addr, err)
	}
	c.base = u
	for _, o := range opts {
		o(c)
	}
	if c.hc == nil {
		tr := &http.Transport{
			MaxIdleConnsPerHost: 64,
			IdleConnTimeout:     90 * time.Second,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		}
		if c.socket != "" {
			sock := c.socket
			tr.DialContext = func(ctx context.Context, _, _ string) (net.Conn, error) {
				var d net.Dialer
				return d.DialContext(ctx, "unix", sock)
			}
		}
		c.hc = &http.Client{Transport: tr}
	}
	return c, nil
}

// Error is an error answer from the daemon.
type Error struct {
	Status  int
	Code    string
	Message string
}

func (e *Error) Error() string {
	return fmt.Sprintf("sandbox daemon: %s (%d %s)", e.Message, e.Status, e.Code)
}

// IsCode reports whether err is a daemon error with the given api.Code*.
func IsCode(err error, code string) bool {
	var e *Error
	return errors.As(err, &e) && e.Code == code
}

// IsNotFound reports whether err says that something does not exist.
func IsNotFound(err error) bool { return IsCode(err, api.CodeNotFound) }

// request describes one call.
type request struct {
	method      string
	path        string
	query       url.Values
	body        io.Reader
	json        any
	contentType string
	idempotent  bool
}

// do sends req and returns the response for a 2xx answer; other answers
// become *Error. Idempotent calls are retried on connection errors and 503.
func (c *Client) do(ctx context.Context, req request) (*http.Response, error) {
	var payload []byte
	if req.json != nil {
		var err error
		if payload, err = json.Marshal(req.json); err != nil {
			return nil, err
		}
		req.contentType = "application/json"
	}
	u := *c.base
	u.Path = strings.TrimSuffix(u.Path, "/") + req.path
	u.RawQuery = req.query.Encode()
	attempts := 1
	if req.idempotent {
		attempts += max(c.retries, 0)
	}
	var lastErr error
	for i := range attempts {
		if i > 0 {
			select {
			case <-time.After(time.Duration(50<<(i-1)) * time.Millisecond):
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		body := req.body
		if payload != nil {
			body = bytes.NewReader(payload)
		}
		hr, err := http.NewRequestWithContext(ctx, req.method, u.String(), body)
		if err != nil {
			return nil, err
		}
		if c.token != "" {
			hr.Header.Set("Authorization", "Bearer "+c.token)
		}
		if req.contentType != "" {
			hr.Header.Set("Content-Type", req.contentType)
		}
		resp, err := c.hc.Do(hr)
		if err != nil {
			lastErr = err
			if ctx.Err() != nil {
				return nil, err
			}
			continue
		}
		if resp.StatusCode >= 200 && resp.StatusCode < 300 {
			return resp, nil
		}
		lastErr = decodeError(resp)
		if resp.StatusCode != http.StatusServiceUnavailable {
			return nil, lastErr
		}
	}
	return nil, lastErr
}

func decodeError(resp *http.Response) error {
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	var eb api.ErrorBody
	if json.Unmarshal(b, &eb) == nil && eb.Error.Code != "" {
		return &Error{Status: resp.StatusCode, Code: eb.Error.Code, Message: eb.Error.Message}
	}
	return &Error{Status: resp.StatusCode, Code: "http_" + strconv.Itoa(resp.StatusCode), Message: strings.TrimSpace(string(b))}
}

// call sends req and decodes a JSON answer into out (if not nil).
func (c *Client) call(ctx context.Context, req request, out any) error {
	resp, err := c.do(ctx, req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("decode %s %s answer: %w", req.method, req.path, err)
	}
	// The decoder stops at the end of the value, before the newline the
	// server ends it with; a body closed unread costs the connection (the
	// next call would dial again).
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	return nil
}

// Health calls GET /v1/health (no token needed).
func (c *Client) Health(ctx context.Context) (api.Health, error) {
	var h api.Health
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/health", idempotent: true}, &h)
	return h, err
}

// Renew marks the sandbox as in use, for idle leases.
func (c *Client) Renew(ctx context.Context) error {
	return c.call(ctx, request{method: http.MethodPost, path: "/v1/renew", idempotent: true}, nil)
}

// RotateToken replaces the client's own token in the sandbox by the one
// whose hex SHA-256 is newHash (POST /v1/token); the sandbox's other tokens
// stay. From then on the client's token gets 401: make a new client with
// the new token. Not retried (a lost answer would make the retry a 401).
func (c *Client) RotateToken(ctx context.Context, newHash string) error {
	return c.call(ctx, request{method: http.MethodPost, path: "/v1/token", json: api.TokenRequest{TokenSHA256: newHash}}, nil)
}

// ExecResult is the outcome of a command with its output as bytes.
type ExecResult struct {
	ExitCode  int
	Signal    string
	Stdout    []byte
	Stderr    []byte
	TimedOut  bool
	Truncated bool
	Duration  time.Duration
	// SessionAlive is set for session runs: false when the command ended the shell.
	SessionAlive bool
}

func fromAPI(r api.ExecResult) *ExecResult {
	out := &ExecResult{
		ExitCode: r.ExitCode, Signal: r.Signal, TimedOut: r.TimedOut, Truncated: r.Truncated,
		Duration: time.Duration(r.DurationMS) * time.Millisecond,
		Stdout:   []byte(r.Stdout), Stderr: []byte(r.Stderr),
	}
	if r.StdoutBase64 != nil {
		out.Stdout = r.StdoutBase64
	}
	if r.StderrBase64 != nil {
		out.Stderr = r.StderrBase64
	}
	return out
}

// Exec runs a command and waits for it. A non-zero exit is not an error.
func (c *Client) Exec(ctx context.Context, req api.ExecRequest) (*ExecResult, error) {
	var r api.ExecResult
	if err := c.call(ctx, request{method: http.MethodPost, path: "/v1/exec", json: req}, &r); err != nil {
		return nil, err
	}
	return fromAPI(r), nil
}

// EventStream reads NDJSON events; Close it when done.
type EventStream struct {
	body io.ReadCloser
	dec  *json.Decoder
}

// Next returns the next event, or io.EOF at the end of the stream.
func (s *EventStream) Next() (api.Event, error) {
	var ev api.Event
	err := s.dec.Decode(&ev)
	return ev, err
}

// Close releases the stream (and, for a follow, stops it).
func (s *EventStream) Close() error { return s.body.Close() }

func newStream(resp *http.Response) *EventStream {
	return &EventStream{body: resp.Body, dec: json.NewDecoder(resp.Body)}
}

// ExecStream runs a command and streams its output as events, ending with
// an exit event. Closing the stream early kills the command.
func (c *Client) ExecStream(ctx context.Context, req api.ExecRequest) (*EventStream, error) {
	resp, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/exec", query: url.Values{"stream": {"1"}}, json: req})
	if err != nil {
		return nil, err
	}
	return newStream(resp), nil
}

// StartProcess starts a background process.
func (c *Client) StartProcess(ctx context.Context, req api.ProcessRequest) (api.Process, error) {
	var p api.Process
	err := c.call(ctx, request{method: http.MethodPost, path: "/v1/processes", json: req}, &p)
	return p, err
}

// Processes lists background processes (and the main process).
func (c *Client) Processes(ctx context.Context) ([]api.Process, error) {
	var ps []api.Process
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/processes", idempotent: true}, &ps)
	return ps, err
}

// Process returns one process's status.
func (c *Client) Process(ctx context.Context, id string) (api.Process, error) {
	var p api.Process
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/processes/" + url.PathEscape(id), idempotent: true}, &p)
	return p, err
}

// WaitProcess waits until the process has exited and its output is complete.
func (c *Client) WaitProcess(ctx context.Context, id string) (api.Process, error) {
	var p api.Process
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/processes/" + url.PathEscape(id),
		query: url.Values{"wait": {"1"}}, idempotent: true}, &p)
	return p, err
}

// ProcessOutput streams a process's output from offset; with follow it
// goes on until the process exits, ending with an exit event.
func (c *Client) ProcessOutput(ctx context.Context, id string, offset int64, follow bool) (*EventStream, error) {
	q := url.Values{"offset": {strconv.FormatInt(offset, 10)}}
	if follow {
		q.Set("follow", "1")
	}
	resp, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/processes/" + url.PathEscape(id) + "/output", query: q, idempotent: true})
	if err != nil {
		return nil, err
	}
	return newStream(resp), nil
}

// WriteStdin writes r to the process's stdin, closing it after when close.
func (c *Client) WriteStdin(ctx context.Context, id string, r io.Reader, close bool) error {
	q := url.Values{}
	if close {
		q.Set("close", "1")
	}
	return c.call(ctx, request{method: http.MethodPost, path: "/v1/processes/" + url.PathEscape(id) + "/stdin",
		query: q, body: r, contentType: "application/octet-stream"}, nil)
}

// Signal sends a signal ("TERM", "KILL", "9") to the process's group.
func (c *Client) Signal(ctx context.Context, id, signal string) (api.Process, error) {
	var p api.Process
	err := c.call(ctx, request{method: http.MethodPost, path: "/v1/processes/" + url.PathEscape(id) + "/signal",
		json: api.SignalRequest{Signal: signal}}, &p)
	return p, err
}

// KillProcess stops the process (TERM, grace, KILL), waits, and forgets it.
func (c *Client) KillProcess(ctx context.Context, id string) (api.Process, error) {
	var p api.Process
	err := c.call(ctx, request{method: http.MethodDelete, path: "/v1/processes/" + url.PathEscape(id)}, &p)
	return p, err
}

// CreateSession starts a persistent shell.
func (c *Client) CreateSession(ctx context.Context, req api.SessionRequest) (api.Session, error) {
	var s api.Session
	err := c.call(ctx, request{method: http.MethodPost, path: "/v1/sessions", json: req}, &s)
	return s, err
}

// Run runs a command in a session; cwd, variables and functions persist.
func (c *Client) Run(ctx context.Context, session string, req api.RunRequest) (*ExecResult, error) {
	var r api.RunResult
	if err := c.call(ctx, request{method: http.MethodPost, path: "/v1/sessions/" + url.PathEscape(session) + "/run", json: req}, &r); err != nil {
		return nil, err
	}
	out := fromAPI(r.ExecResult)
	out.SessionAlive = r.SessionAlive
	return out, nil
}

// Interrupt sends SIGINT to the session's foreground command.
func (c *Client) Interrupt(ctx context.Context, session string) error {
	return c.call(ctx, request{method: http.MethodPost, path: "/v1/sessions/" + url.PathEscape(session) + "/interrupt"}, nil)
}

// CloseSession ends the session's shell and everything it started.
func (c *Client) CloseSession(ctx context.Context, session string) error {
	return c.call(ctx, request{method: http.MethodDelete, path: "/v1/sessions/" + url.PathEscape(session)}, nil)
}

// ReadFile streams a file's bytes.
func (c *Client) ReadFile(ctx context.Context, path string) (io.ReadCloser, error) {
	resp, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/files", query: url.Values{"path": {path}}, idempotent: true})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// WriteFile streams r into path atomically (parents created) with mode.
func (c *Client) WriteFile(ctx context.Context, path string, r io.Reader, mode fs.FileMode) (api.WriteResult, error) {
	var out api.WriteResult
	q := url.Values{"path": {path}}
	if mode != 0 {
		q.Set("mode", strconv.FormatUint(uint64(mode.Perm()), 8))
	}
	err := c.call(ctx, request{method: http.MethodPut, path: "/v1/files", query: q, body: r, contentType: "application/octet-stream"}, &out)
	return out, err
}

// DownloadTar streams the directory dir as a tar archive.
func (c *Client) DownloadTar(ctx context.Context, dir string) (io.ReadCloser, error) {
	resp, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/files",
		query: url.Values{"path": {dir}, "archive": {"tar"}}, idempotent: true})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// UploadTar extracts the tar stream r into dir (created).
func (c *Client) UploadTar(ctx context.Context, dir string, r io.Reader) (api.WriteResult, error) {
	var out api.WriteResult
	err := c.call(ctx, request{method: http.MethodPut, path: "/v1/files",
		query: url.Values{"path": {dir}, "archive": {"tar"}}, body: r, contentType: "application/x-tar"}, &out)
	return out, err
}

// Stat describes path (symlinks are not followed).
func (c *Client) Stat(ctx context.Context, path string) (api.FileInfo, error) {
	var fi api.FileInfo
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/files/stat", query: url.Values{"path": {path}}, idempotent: true}, &fi)
	return fi, err
}

// List lists dir down to depth levels (1: its entries).
func (c *Client) List(ctx context.Context, dir string, depth int) (api.FileList, error) {
	var l api.FileList
	q := url.Values{"path": {dir}}
	if depth > 0 {
		q.Set("depth", strconv.Itoa(depth))
	}
	err := c.call(ctx, request{method: http.MethodGet, path: "/v1/files/list", query: q, idempotent: true}, &l)
	return l, err
}

// Remove deletes path; recursive removes a directory with its contents.
func (c *Client) Remove(ctx context.Context, path string, recursive bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "1")
	}
	return c.call(ctx, request{method: http.MethodDelete, path: "/v1/files", query: q}, nil)
}

// Move renames from to to (parents of to created).
func (c *Client) Move(ctx context.Context, from, to string, overwrite bool) (api.FileInfo, error) {
	var fi api.FileInfo
	err := c.call(ctx, request{method: http.MethodPost, path: "/v1/files/move", json: api.MoveRequest{From: from, To: to, Overwrite: overwrite}}, &fi)
	return fi, err
}

// Mkdir creates dir and its parents.
func (c *Client) Mkdir(ctx context.Context, dir string, mode fs.FileMode) (api.FileInfo, error) {
	var fi api.FileInfo
	q := url.Values{"path": {dir}}
	if mode != 0 {
		q.Set("mode", strconv.FormatUint(uint64(mode.Perm()), 8))
	}
	err := c.call(ctx, request{method: http.MethodPost, path: "/v1/files/mkdir", query: q, idempotent: true}, &fi)
	return fi, err
}

package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"

	"github.com/coder/websocket"
)

// TermSize is a terminal's size in characters.
type TermSize struct {
	Width  uint16
	Height uint16
}

// AttachOptions describes an interactive command.
type AttachOptions struct {
	// Cmd is the argv (default: the image's shell).
	Cmd []string
	Env map[string]string
	Cwd string
	// TTY runs the command on a pseudo-terminal (stdout and stderr merge).
	TTY bool
	// Size is the initial terminal size; Resize delivers later ones.
	Size   *TermSize
	Resize <-chan TermSize
	// Stdin, when set, is copied to the command; its EOF closes the
	// command's stdin.
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// Attach runs a command interactively over a WebSocket and returns its exit
// code once it ends.
func (c *Client) Attach(ctx context.Context, o AttachOptions) (int, error) {
	q := url.Values{}
	for _, a := range o.Cmd {
		q.Add("cmd", a)
	}
	for k, v := range o.Env {
		q.Add("env", k+"="+v)
	}
	if o.Cwd != "" {
		q.Set("cwd", o.Cwd)
	}
	if o.TTY {
		q.Set("tty", "1")
	}
	if o.Stdin != nil {
		q.Set("stdin", "1")
	}
	if o.Size != nil {
		q.Set("cols", strconv.Itoa(int(o.Size.Width)))
		q.Set("rows", strconv.Itoa(int(o.Size.Height)))
	}
	u := *c.base
	u.Scheme = map[string]string{"https": "wss"}[u.Scheme]
	if u.Scheme == "" {
		u.Scheme = "ws"
	}
	u.Path += "/v1/attach"
	u.RawQuery = q.Encode()
	h := http.Header{}
	if c.token != "" {
		h.Set("Authorization", "Bearer "+c.token)
	}
	conn, resp, err := websocket.Dial(ctx, u.String(), &websocket.DialOptions{
		HTTPClient: c.hc, HTTPHeader: h, Subprotocols: []string{"v4.channel.k8s.io"},
	})
	if err != nil {
		if resp != nil && resp.StatusCode >= 300 {
			return -1, decodeError(resp)
		}
		return -1, fmt.Errorf("attach: %w", err)
	}
	defer conn.CloseNow()
	conn.SetReadLimit(4 << 20)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	if o.Stdin != nil {
		go func() {
			buf := make([]byte, 32<<10)
			for {
				n, err := o.Stdin.Read(buf)
				if n > 0 {
					if conn.Write(ctx, websocket.MessageBinary, append([]byte{0}, buf[:n]...)) != nil {
						return
					}
				}
				if err != nil {
					_ = conn.Write(ctx, websocket.MessageBinary, []byte{0})
					return
				}
			}
		}()
	}
	if o.Resize != nil {
		go func() {
			for {
				select {
				case sz := <-o.Resize:
					b, _ := json.Marshal(struct{ Width, Height uint16 }{sz.Width, sz.Height})
					if conn.Write(ctx, websocket.MessageBinary, append([]byte{4}, b...)) != nil {
						return
					}
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	for {
		_, msg, err := conn.Read(ctx)
		if err != nil {
			if websocket.CloseStatus(err) == websocket.StatusNormalClosure {
				return -1, errors.New("attach: the daemon closed the stream without an exit status")
			}
			return -1, fmt.Errorf("attach: %w", err)
		}
		if len(msg) == 0 {
			continue
		}
		switch msg[0] {
		case 1:
			if o.Stdout != nil {
				_, _ = o.Stdout.Write(msg[1:])
			}
		case 2:
			if o.Stderr != nil {
				_, _ = o.Stderr.Write(msg[1:])
			}
		case 3:
			return exitFromStatus(msg[1:])
		}
	}
}

// exitFromStatus reads the exit code from a Kubernetes channel status.
func exitFromStatus(b []byte) (int, error) {
	var st struct {
		Status  string `json:"status"`
		Message string `json:"message"`
		Reason  string `json:"reason"`
		Details struct {
			Causes []struct {
				Reason  string `json:"reason"`
				Message string `json:"message"`
			} `json:"causes"`
		} `json:"details"`
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return -1, fmt.Errorf("attach: bad status %q: %w", b, err)
	}
	if st.Status == "Success" {
		return 0, nil
	}
	for _, c := range st.Details.Causes {
		if c.Reason == "ExitCode" {
			if n, err := strconv.Atoi(c.Message); err == nil {
				return n, nil
			}
		}
	}
	return -1, fmt.Errorf("attach: %s", st.Message)
}

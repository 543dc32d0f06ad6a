package daemon_test

import (
	"bytes"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sandman-dev/sandman/daemon/client"
)

// lockedBuffer is a bytes.Buffer safe for a writer and a poller.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestAttachTTY(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	inR, inW := io.Pipe()
	defer inW.Close()
	var out lockedBuffer
	resize := make(chan client.TermSize, 1)
	done := make(chan struct{})
	var code int
	var err error
	go func() {
		defer close(done)
		code, err = h.client.Attach(ctx, client.AttachOptions{
			Cmd: []string{"/bin/sh"}, TTY: true, Size: &client.TermSize{Width: 100, Height: 30},
			Resize: resize, Stdin: inR, Stdout: &out,
		})
	}()
	io.WriteString(inW, "tty -s && echo is-a-tty; stty size\n")
	eventually(t, 5*time.Second, "the first answers", func() bool {
		return strings.Contains(out.String(), "is-a-tty") && strings.Contains(out.String(), "30 100")
	})
	resize <- client.TermSize{Width: 120, Height: 40}
	eventually(t, 5*time.Second, "the resize", func() bool {
		io.WriteString(inW, "stty size\n")
		return strings.Contains(out.String(), "40 120")
	})
	io.WriteString(inW, "exit 3\n")
	<-done
	if err != nil || code != 3 {
		t.Fatalf("attach ended with %d, %v; output %q", code, err, out.String())
	}
}

func TestAttachPipes(t *testing.T) {
	h := newHarness(t)
	var out, errOut bytes.Buffer
	code, err := h.client.Attach(t.Context(), client.AttachOptions{
		Cmd:   []string{"sh", "-c", "cat; echo done >&2; exit 5"},
		Stdin: strings.NewReader("through stdin\n"), Stdout: &out, Stderr: &errOut,
	})
	if err != nil || code != 5 || out.String() != "through stdin\n" || errOut.String() != "done\n" {
		t.Fatalf("code %d err %v stdout %q stderr %q", code, err, out.String(), errOut.String())
	}
	_, err = h.client.Attach(t.Context(), client.AttachOptions{Cmd: []string{"no-such-program"}})
	if !client.IsNotFound(err) {
		t.Fatalf("attach of a missing program: %v", err)
	}
}

package daemon_test

import (
	"bytes"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/client"
)

// collect reads a stream to its end and returns output and the exit event.
func collect(t *testing.T, st *client.EventStream) (string, *api.Event) {
	t.Helper()
	defer st.Close()
	var out bytes.Buffer
	var exit *api.Event
	for {
		ev, err := st.Next()
		if err == io.EOF {
			return out.String(), exit
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Type == api.EventExit {
			exit = &ev
		} else {
			out.Write(ev.Data)
		}
	}
}

func TestProcessLifecycle(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	p, err := h.client.StartProcess(ctx, api.ProcessRequest{
		Shell: "echo start; read line; echo got $line; exit 4", Stdin: true, Tag: "reader",
	})
	if err != nil {
		t.Fatal(err)
	}
	if p.ID == "" || p.PID == 0 || !p.Running || p.Tag != "reader" {
		t.Fatalf("started: %+v", p)
	}
	eventually(t, 5*time.Second, "the first output", func() bool {
		q, err := h.client.Process(ctx, p.ID)
		return err == nil && q.OutputBytes == int64(len("start\n"))
	})
	if err := h.client.WriteStdin(ctx, p.ID, strings.NewReader("hello\n"), true); err != nil {
		t.Fatal(err)
	}
	done, err := h.client.WaitProcess(ctx, p.ID)
	if err != nil {
		t.Fatal(err)
	}
	if done.Running || done.ExitCode == nil || *done.ExitCode != 4 || done.ExitedAt == nil {
		t.Fatalf("after exit: %+v", done)
	}
	st, err := h.client.ProcessOutput(ctx, p.ID, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	out, exit := collect(t, st)
	if out != "start\ngot hello\n" || exit == nil || *exit.ExitCode != 4 {
		t.Fatalf("output %q exit %+v", out, exit)
	}
	// Re-attach from an offset.
	st, err = h.client.ProcessOutput(ctx, p.ID, 6, false)
	if err != nil {
		t.Fatal(err)
	}
	if out, _ = collect(t, st); out != "got hello\n" {
		t.Fatalf("from offset 6: %q", out)
	}
	ps, err := h.client.Processes(ctx)
	if err != nil || len(ps) != 1 || ps[0].ID != p.ID {
		t.Fatalf("list = %+v, %v", ps, err)
	}
	// Stdin of an exited process is closed.
	if err := h.client.WriteStdin(ctx, p.ID, strings.NewReader("x"), false); !client.IsCode(err, api.CodeConflict) {
		t.Fatalf("stdin after exit: %v", err)
	}
}

// TestProcessFollow: a follower sees output as it is written and the exit,
// and a second client can re-attach while the process runs.
func TestProcessFollow(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	p, err := h.client.StartProcess(ctx, api.ProcessRequest{Shell: "for i in 1 2 3; do echo line$i; read x; done", Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	st, err := h.client.ProcessOutput(ctx, p.ID, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	var got bytes.Buffer
	for i := 1; i <= 3; i++ {
		want := "line" + string(rune('0'+i)) + "\n"
		for !strings.HasSuffix(got.String(), want) {
			ev, err := st.Next()
			if err != nil {
				t.Fatalf("waiting for %q: %v (have %q)", want, err, got.String())
			}
			got.Write(ev.Data)
		}
		if err := h.client.WriteStdin(ctx, p.ID, strings.NewReader("\n"), false); err != nil {
			t.Fatal(err)
		}
	}
	for {
		ev, err := st.Next()
		if err != nil {
			t.Fatalf("want an exit event: %v", err)
		}
		if ev.Type == api.EventExit {
			if *ev.ExitCode != 0 {
				t.Fatalf("exit %+v", ev)
			}
			break
		}
	}
	if got.String() != "line1\nline2\nline3\n" {
		t.Fatalf("followed %q", got.String())
	}
}

func TestProcessSignalAndKill(t *testing.T) {
	h := newHarness(t)
	ctx := t.Context()
	p, err := h.client.StartProcess(ctx, api.ProcessRequest{Cmd: []string{"sleep", "300"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.Signal(ctx, p.ID, "TERM"); err != nil {
		t.Fatal(err)
	}
	done, err := h.client.WaitProcess(ctx, p.ID)
	if err != nil {
		t.Fatal(err)
	}
	if done.Signal != "TERM" || *done.ExitCode != 143 {
		t.Fatalf("after TERM: %+v", done)
	}
	if _, err := h.client.Signal(ctx, p.ID, "NOPE"); !client.IsCode(err, api.CodeBadRequest) {
		t.Fatalf("unknown signal: %v", err)
	}
	if _, err := h.client.Signal(ctx, p.ID, "KILL"); !client.IsCode(err, api.CodeConflict) {
		t.Fatalf("signal after exit: %v", err)
	}

	// DELETE stops a process that ignores TERM with KILL after the grace.
	q, err := h.client.StartProcess(ctx, api.ProcessRequest{Shell: "trap '' TERM; echo ready; while :; do sleep 1; done"})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 5*time.Second, "the trap to be set", func() bool {
		x, err := h.client.Process(ctx, q.ID)
		return err == nil && x.OutputBytes > 0
	})
	killed, err := h.client.KillProcess(ctx, q.ID)
	if err != nil {
		t.Fatal(err)
	}
	if killed.Running || killed.Signal != "KILL" {
		t.Fatalf("after delete: %+v", killed)
	}
	if _, err := h.client.Process(ctx, q.ID); !client.IsNotFound(err) {
		t.Fatalf("deleted process still listed: %v", err)
	}
	if alive(q.PID) {
		t.Fatalf("process %d still alive", q.PID)
	}
}

func TestProcessTimeout(t *testing.T) {
	h := newHarness(t)
	p, err := h.client.StartProcess(t.Context(), api.ProcessRequest{Cmd: []string{"sleep", "300"}, TimeoutSeconds: 0.2})
	if err != nil {
		t.Fatal(err)
	}
	done, err := h.client.WaitProcess(t.Context(), p.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !done.TimedOut || done.Signal != "KILL" {
		t.Fatalf("%+v", done)
	}
}

// TestProcessOutputRetention: a process that writes more than the retained
// amount keeps the newest output and says how much was dropped.
func TestProcessOutputRetention(t *testing.T) {
	h := newHarness(t, func(c *daemonConfig) { c.ProcessOutputBytes = 64 << 10 })
	ctx := t.Context()
	p, err := h.client.StartProcess(ctx, api.ProcessRequest{Shell: "head -c 1000000 /dev/zero; echo END"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.client.WaitProcess(ctx, p.ID); err != nil {
		t.Fatal(err)
	}
	st, err := h.client.ProcessOutput(ctx, p.ID, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	first, err := st.Next()
	if err != nil {
		t.Fatal(err)
	}
	if first.Dropped == 0 || first.Offset != first.Dropped {
		t.Fatalf("first event offset %d dropped %d: want the dropped prefix reported", first.Offset, first.Dropped)
	}
	// The newest chunk may be the only one retained, so the first event's
	// data counts too.
	rest, _ := collect(t, st)
	out := string(first.Data) + rest
	if !strings.HasSuffix(out, "END\n") {
		t.Fatalf("newest output lost: ends %q", out[max(0, len(out)-10):])
	}
}

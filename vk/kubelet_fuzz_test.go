package vk

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/virtual-kubelet/virtual-kubelet/node/api"

	daemonapi "github.com/sandman-dev/sandman/daemon/api"
)

// The kubelet API's query parameters. virtual-kubelet's handlers parse
// them (the same routes sandman-vk serves, through api.PodHandler); the
// provider reads the parsed options with logSince, format, lastLines and
// limit, which GetContainerLogs applies in this order to the daemon's
// output. The fuzz drives the real routes with any query string and
// checks both halves.

var logParams = []string{"tailLines", "follow", "limitBytes", "previous", "sinceSeconds", "sinceTime", "timestamps"}

// FuzzContainerLogsQuery: GET /containerLogs/ns/pod/main?<query> over a
// chunk of output written at a given time.
func FuzzContainerLogsQuery(f *testing.F) {
	for _, q := range []string{
		"", "tailLines=2", "tailLines=0", "tailLines=-1", "tailLines=x", "tailLines=1&tailLines=2", "tailLines=%zz",
		"follow=true", "follow=1", "follow=maybe", "limitBytes=10", "limitBytes=0", "limitBytes=99999999999999999999",
		"sinceSeconds=60", "sinceSeconds=0", "sinceSeconds=9223372036", "sinceSeconds=9223372037", "sinceSeconds=9223372036854775807",
		"sinceTime=2024-01-02T03:04:05Z", "sinceTime=2024-01-02T03:04:05.123456789+02:00", "sinceTime=yesterday",
		"sinceSeconds=1&sinceTime=2024-01-02T03:04:05Z", "timestamps=1", "timestamps=TRUE", "timestamps=yes", "previous=true",
		"tailLines=1&limitBytes=3&timestamps=true&follow=false", "tailLines=3;limitBytes=2",
	} {
		for _, data := range []string{"a\nb\nc\n", "partial line", "crlf\r\nline\r\n", "", "\n\n\n"} {
			f.Add(q, []byte(data), int64(1_700_000_000_123_456_789))
		}
	}
	var got *api.ContainerLogOpts
	h := api.PodHandler(api.PodHandlerConfig{
		GetContainerLogs: func(_ context.Context, _, _, _ string, opts api.ContainerLogOpts) (io.ReadCloser, error) {
			got = &opts
			return io.NopCloser(bytes.NewReader(nil)), nil
		},
	}, false)
	now := time.Unix(1_800_000_000, 0)
	f.Fuzz(func(t *testing.T, query string, data []byte, written int64) {
		got = nil
		r := httptest.NewRequest(http.MethodGet, "/containerLogs/ns/pod/main", nil)
		r.URL.RawQuery = query
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		q := r.URL.Query()
		if got == nil {
			// Refused: 400, naming a parameter the query carries.
			named := false
			for _, p := range logParams {
				named = named || q.Get(p) != "" && strings.Contains(w.Body.String(), `"`+p+`"`)
			}
			if w.Code != http.StatusBadRequest || !named {
				t.Fatalf("query %q: answer %d %q, want 400 naming the parameter", query, w.Code, w.Body)
			}
			return
		}
		opts := *got
		if opts.Tail < 0 || opts.LimitBytes < 0 || opts.SinceSeconds < 0 || opts.SinceSeconds > 0 && !opts.SinceTime.IsZero() {
			t.Fatalf("query %q parsed to %+v", query, opts)
		}

		since := logSince(opts, now)
		switch {
		case opts.SinceSeconds > 0:
			// Never in the future (that would hide all output): exactly
			// that far back, or everything.
			if since.After(now) || !since.IsZero() && now.Sub(since) != time.Duration(opts.SinceSeconds)*time.Second {
				t.Fatalf("query %q: since %v for %ds before %v", query, since, opts.SinceSeconds, now)
			}
		case !since.Equal(opts.SinceTime):
			t.Fatalf("query %q: since %v, want sinceTime %v", query, since, opts.SinceTime)
		}

		ev := daemonapi.Event{Data: data, Time: time.Unix(0, written)}
		out := format(ev, opts.Timestamps)
		checkFormat(t, ev, opts.Timestamps, out)
		if opts.Tail > 0 {
			tail := lastLines(out, opts.Tail)
			if n := lineCount(out); !bytes.HasSuffix(out, tail) || lineCount(tail) != min(n, opts.Tail) ||
				len(tail) < len(out) && out[len(out)-len(tail)-1] != '\n' {
				t.Fatalf("lastLines(%q, %d) = %q", out, opts.Tail, tail)
			}
			out = tail
		}
		rc := limit(io.NopCloser(bytes.NewReader(out)), opts.LimitBytes)
		limited, err := io.ReadAll(rc)
		if err != nil || rc.Close() != nil {
			t.Fatal(err)
		}
		want := out
		if opts.LimitBytes > 0 && len(want) > opts.LimitBytes {
			want = want[:opts.LimitBytes]
		}
		if !bytes.Equal(limited, want) {
			t.Fatalf("limit(%q, %d) = %q", out, opts.LimitBytes, limited)
		}
	})
}

// checkFormat: without timestamps the output is the data; with them, each
// line of the data (the last one ended) behind the chunk's time in
// RFC 3339 and a space.
func checkFormat(t *testing.T, ev daemonapi.Event, timestamps bool, out []byte) {
	t.Helper()
	if !timestamps {
		if !bytes.Equal(out, ev.Data) {
			t.Fatalf("format(%q) = %q without timestamps", ev.Data, out)
		}
		return
	}
	var rest []byte
	for line := range bytes.Lines(out) {
		stamp, text, ok := bytes.Cut(line, []byte(" "))
		at, err := time.Parse(time.RFC3339Nano, string(stamp))
		if !ok || err != nil || !at.Equal(ev.Time) {
			t.Fatalf("format(%q at %v): line %q does not start with the time", ev.Data, ev.Time, line)
		}
		rest = append(rest, text...)
	}
	want := ev.Data
	if len(want) > 0 && want[len(want)-1] != '\n' {
		want = append(bytes.Clone(want), '\n')
	}
	if !bytes.Equal(rest, want) {
		t.Fatalf("format(%q) = %q: the lines are not the data's", ev.Data, out)
	}
}

// lineCount counts lines, a last one without its newline included.
func lineCount(b []byte) int {
	n := bytes.Count(b, []byte("\n"))
	if len(b) > 0 && b[len(b)-1] != '\n' {
		n++
	}
	return n
}

// FuzzExecQuery: the exec route's stream flags (input, output, error,
// tty: "1" is on, anything else off), parsed by virtual-kubelet before
// the stream is upgraded. RunInContainer takes them from the upgraded
// stream (AttachIO.TTY, Stdin), so the contract it relies on is checked
// here: a tty with a separate stderr and a call with no stream are refused
// with a message saying so; anything else goes on to the upgrade, which a
// plain request does not make, so the provider is never called.
func FuzzExecQuery(f *testing.F) {
	for _, q := range []string{
		"command=sh&command=-c&command=echo+hi&input=1&output=1&tty=1", "command=ls&output=1&error=1", "command=ls&tty=1&error=1&output=1",
		"command=ls", "command=ls&input=true&output=true", "command=&output=1", "output=1", "tty=1&input=1", "input=1&input=0", "output=%zz",
		"command=a;output=1",
	} {
		f.Add(q, false)
	}
	called := false
	h := api.PodHandler(api.PodHandlerConfig{
		RunInContainer: func(context.Context, string, string, string, []string, api.AttachIO) error {
			called = true
			return nil
		},
	}, false)
	f.Fuzz(func(t *testing.T, query string, post bool) {
		called = false
		method := http.MethodGet
		if post {
			method = http.MethodPost
		}
		r := httptest.NewRequest(method, "/exec/ns/pod/main", nil)
		r.URL.RawQuery = query
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if called {
			t.Fatalf("query %q: the provider ran a command without an upgraded stream", query)
		}
		q, _ := url.ParseQuery(query)
		on := func(k string) bool { return q.Get(k) == "1" }
		body := w.Body.String()
		const ttyErr, noStream = "cannot exec with tty and stderr", "at least one of stdin, stdout, stderr"
		switch {
		case on("tty") && on("error"):
			if w.Code != http.StatusBadRequest || !strings.Contains(body, ttyErr) {
				t.Fatalf("query %q (tty and stderr): answer %d %q", query, w.Code, body)
			}
		case !on("input") && !on("output") && !on("error"):
			if w.Code != http.StatusBadRequest || !strings.Contains(body, noStream) {
				t.Fatalf("query %q (no stream): answer %d %q", query, w.Code, body)
			}
		case strings.Contains(body, ttyErr) || strings.Contains(body, noStream):
			t.Fatalf("query %q: valid flags refused: %d %q", query, w.Code, body)
		}
	})
}

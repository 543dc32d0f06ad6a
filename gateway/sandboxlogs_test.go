package gateway

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// A JSON log line in slog's shape becomes an entry with its level,
// message and fields; any other line is a message at level info; the time
// is kubectl's.
func TestParseLogLine(t *testing.T) {
	at := time.Date(2026, 12, 2, 10, 0, 0, 123000000, time.UTC)
	for _, c := range []struct {
		in                string
		level, msg, field string
	}{
		{`2026-12-02T10:00:00.123Z {"time":"x","level":"WARN","msg":"too many connections","client":"10.0.0.1","max":8}`, "warn", "too many connections", "client=10.0.0.1 max=8"},
		{`2026-12-02T10:00:00.123Z hello world`, "info", "hello world", ""},
		{`2026-12-02T10:00:00.123Z {"not":"slog"}`, "info", `{"not":"slog"}`, ""},
	} {
		e, _ := parseLogLine(c.in)
		if !e.Timestamp.Equal(at) || e.Level != c.level || e.Message != c.msg {
			t.Errorf("%s: %+v", c.in, e)
		}
		if c.field != "" && (e.Fields["client"] != "10.0.0.1" || e.Fields["max"] != "8") {
			t.Errorf("%s: fields %v", c.in, e.Fields)
		}
	}
	if e, line := parseLogLine("no timestamp"); !e.Timestamp.IsZero() || e.Message != "no timestamp" || line != "no timestamp" {
		t.Errorf("no timestamp: %+v %q", e, line)
	}
}

// The log calls answer the key's sandbox's pod log (the fake clientset's
// is "fake logs"), filtered as asked; another namespace's key gets 404.
func TestSandboxLogs(t *testing.T) {
	e := newEnv(t)
	sb, _ := e.createReady(rawKeyA, nsA, map[string]any{"templateID": "base"})
	var v2 struct{ Logs []sandboxLogEntry }
	if r := e.call(http.MethodGet, "/v2/sandboxes/"+sb.SandboxID+"/logs", rawKeyA, nil); r.status != http.StatusOK {
		t.Fatalf("v2 logs: %d %s", r.status, r.body)
	} else if r.decode(t, &v2); len(v2.Logs) != 1 || v2.Logs[0].Message != "fake logs" || v2.Logs[0].Level != "info" {
		t.Errorf("v2 logs: %+v", v2.Logs)
	}
	for q, want := range map[string]int{"?level=warn": 0, "?search=fake": 1, "?search=real": 0, "?limit=0": 0} {
		e.call(http.MethodGet, "/v2/sandboxes/"+sb.SandboxID+"/logs"+q, rawKeyA, nil).decode(t, &v2)
		if len(v2.Logs) != want {
			t.Errorf("logs%s: %d entries, want %d", q, len(v2.Logs), want)
		}
	}
	var v1 struct {
		Logs       []sandboxLogLine
		LogEntries []sandboxLogEntry
	}
	e.call(http.MethodGet, "/sandboxes/"+sb.SandboxID+"/logs", rawKeyA, nil).decode(t, &v1)
	if len(v1.Logs) != 1 || v1.Logs[0].Line != "fake logs" || len(v1.LogEntries) != 1 {
		t.Errorf("v1 logs: %+v", v1)
	}
	for _, c := range []struct {
		path, key string
		want      int
	}{
		{"/v2/sandboxes/" + sb.SandboxID + "/logs", rawKeyB, http.StatusNotFound},
		{"/v2/sandboxes/" + sb.SandboxID + "/logs?direction=sideways", rawKeyA, http.StatusBadRequest},
		{"/v2/sandboxes/" + sb.SandboxID + "/logs?cursor=-1", rawKeyA, http.StatusBadRequest},
		{"/v2/sandboxes/" + sb.SandboxID + "/logs?level=loud", rawKeyA, http.StatusBadRequest},
	} {
		if r := e.call(http.MethodGet, c.path, c.key, nil); r.status != c.want {
			t.Errorf("%s: %d %s, want %d", c.path, r.status, r.body, c.want)
		}
	}
}

// countingReader counts what was read of it.
type countingReader struct {
	r io.Reader
	n int
}

func (c *countingReader) Read(p []byte) (int, error) {
	k, err := c.r.Read(p)
	c.n += k
	return k, err
}

// A log read keeps only what it answers, however large the log: forward it
// stops reading at its limit, backward it keeps a bounded window of the
// newest lines.
func TestPickLogsBounded(t *testing.T) {
	var log strings.Builder
	const lines = 8 << 10 // 8 MiB of 1 KiB lines
	for i := range lines {
		fmt.Fprintf(&log, "2026-11-30T12:00:00.%06dZ %04d %s\n", i, i, strings.Repeat("x", 1000))
	}
	for _, tc := range []struct {
		name      string
		q         logQuery
		wantFirst string
		wantN     int
	}{
		{"forward, limit 5", logQuery{limit: 5}, "0000 ", 5},
		{"backward, limit 10000", logQuery{limit: 10000, backward: true}, fmt.Sprintf("%04d ", lines-1), sandboxLogKeepBytes / (len("2026-11-30T12:00:00.000000Z 0000 ") + 1000)},
		{"backward, limit 3", logQuery{limit: 3, backward: true}, fmt.Sprintf("%04d ", lines-1), 3},
		{"nothing matches", logQuery{limit: 10, search: "no such text"}, "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cr := &countingReader{r: strings.NewReader(log.String())}
			entries, raw := pickLogs(cr, tc.q, sandboxLogKeepBytes)
			if len(entries) != tc.wantN || len(raw) != tc.wantN {
				t.Fatalf("kept %d entries, want %d", len(entries), tc.wantN)
			}
			size := 0
			for _, l := range raw {
				size += len(l)
			}
			if size > sandboxLogKeepBytes {
				t.Errorf("kept %d bytes, more than %d", size, sandboxLogKeepBytes)
			}
			if tc.wantN > 0 && !strings.HasPrefix(entries[0].Message, tc.wantFirst) {
				t.Errorf("first entry %.20q, want %q…", entries[0].Message, tc.wantFirst)
			}
			if !tc.q.backward && tc.q.search == "" && cr.n > 1<<20 {
				t.Errorf("a forward read of 5 lines read %d bytes of the log", cr.n)
			}
		})
	}
}

package gateway

import (
	"net/http"
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

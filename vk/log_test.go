package vk

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	vklog "github.com/virtual-kubelet/virtual-kubelet/log"
)

func TestVKLogger(t *testing.T) {
	for _, tc := range []struct {
		name  string
		level slog.Level // the handler's
		log   func(vklog.Logger)
		want  []map[string]any // one JSON object per line, keys checked
	}{
		{"levels", slog.LevelDebug, func(l vklog.Logger) {
			l.Debug("d")
			l.Infof("i %d", 1)
			l.Warn("w")
			l.Errorf("e %s", "x")
			l.Fatal("f")
		}, []map[string]any{
			{"level": "DEBUG", "msg": "d"},
			{"level": "INFO", "msg": "i 1"},
			{"level": "WARN", "msg": "w"},
			{"level": "ERROR", "msg": "e x"},
			{"level": "ERROR+4", "msg": "f"},
		}},
		{"below the handler's level", slog.LevelInfo, func(l vklog.Logger) {
			l.Debug("dropped")
			l.Debugf("dropped %d", 1)
			l.Info("kept")
		}, []map[string]any{{"level": "INFO", "msg": "kept"}}},
		{"non-string arguments", slog.LevelInfo, func(l vklog.Logger) {
			l.Error(errors.New("boom")) // virtual-kubelet's pod controller logs errors so
			l.Info("a", 1, 2)
		}, []map[string]any{{"msg": "boom"}, {"msg": "a1 2"}}},
		{"fields and errors", slog.LevelInfo, func(l vklog.Logger) {
			l.WithField("uid", "u1").WithFields(vklog.Fields{"queue": "q", "workerId": 3}).WithError(errors.New("bad")).Warn("sync")
		}, []map[string]any{{"msg": "sync", "uid": "u1", "queue": "q", "workerId": float64(3), "err": "bad"}}},
		{"pod as namespace/name", slog.LevelInfo, func(l vklog.Logger) {
			l.WithFields(vklog.Fields{"pod": "p", "namespace": "ns", "phase": "Running"}).Info("a")
			l.WithFields(vklog.Fields{"name": "p", "namespace": "ns"}).Info("b")
			l.WithField("namespace", "ns").Info("c") // no pod: left alone
		}, []map[string]any{
			{"msg": "a", "pod": "ns/p", "phase": "Running", "namespace": nil},
			{"msg": "b", "pod": "ns/p", "name": nil, "namespace": nil},
			{"msg": "c", "namespace": "ns", "pod": nil},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var buf bytes.Buffer
			tc.log(vkLogger(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: tc.level}))))
			lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
			if buf.Len() == 0 {
				lines = nil
			}
			if len(lines) != len(tc.want) {
				t.Fatalf("got %d lines, want %d:\n%s", len(lines), len(tc.want), buf.String())
			}
			for i, line := range lines {
				var got map[string]any
				if err := json.Unmarshal([]byte(line), &got); err != nil {
					t.Fatalf("line %d: %v: %s", i, err, line)
				}
				for k, want := range tc.want[i] {
					if v, ok := got[k]; want == nil && ok || want != nil && v != want {
						t.Errorf("line %d: %s = %v, want %v (line %s)", i, k, v, want, line)
					}
				}
			}
		})
	}
}

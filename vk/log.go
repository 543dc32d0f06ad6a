package vk

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"

	vklog "github.com/virtual-kubelet/virtual-kubelet/log"
)

// LevelFatal is the level of virtual-kubelet's Fatal messages (slog has
// none above Error).
const LevelFatal = slog.LevelError + 4

// vkLogger adapts l to virtual-kubelet's logger interface. NewNode sets
// virtual-kubelet's log.L to it (WithControllerLogger) so the pod and node controllers'
// messages — errors syncing pods among them — reach the process's log
// instead of virtual-kubelet's default, which discards everything.
//
// Messages are formatted as fmt.Sprint/Sprintf would; WithError adds the
// error under "err", and a "namespace" field given with "pod" or "name"
// becomes one "pod" field, namespace/name, as sandman's own logs have it.
// Fatal logs at LevelFatal and does not exit: virtual-kubelet's code
// never calls it, and a library has no business ending the process.
func vkLogger(l *slog.Logger) vklog.Logger { return slogAdapter{l} }

type slogAdapter struct{ l *slog.Logger }

var _ vklog.Logger = slogAdapter{}

func (a slogAdapter) log(level slog.Level, msg func() string) {
	ctx := context.Background()
	if !a.l.Enabled(ctx, level) {
		return
	}
	a.l.Log(ctx, level, msg())
}

func (a slogAdapter) print(level slog.Level, args []any) {
	a.log(level, func() string { return fmt.Sprint(args...) })
}

func (a slogAdapter) printf(level slog.Level, format string, args []any) {
	a.log(level, func() string { return fmt.Sprintf(format, args...) })
}

func (a slogAdapter) Debug(args ...any)                 { a.print(slog.LevelDebug, args) }
func (a slogAdapter) Debugf(format string, args ...any) { a.printf(slog.LevelDebug, format, args) }
func (a slogAdapter) Info(args ...any)                  { a.print(slog.LevelInfo, args) }
func (a slogAdapter) Infof(format string, args ...any)  { a.printf(slog.LevelInfo, format, args) }
func (a slogAdapter) Warn(args ...any)                  { a.print(slog.LevelWarn, args) }
func (a slogAdapter) Warnf(format string, args ...any)  { a.printf(slog.LevelWarn, format, args) }
func (a slogAdapter) Error(args ...any)                 { a.print(slog.LevelError, args) }
func (a slogAdapter) Errorf(format string, args ...any) { a.printf(slog.LevelError, format, args) }
func (a slogAdapter) Fatal(args ...any)                 { a.print(LevelFatal, args) }
func (a slogAdapter) Fatalf(format string, args ...any) { a.printf(LevelFatal, format, args) }

func (a slogAdapter) WithField(key string, val any) vklog.Logger {
	return a.WithFields(vklog.Fields{key: val})
}

func (a slogAdapter) WithFields(fields vklog.Fields) vklog.Logger {
	ns, hasNS := fields["namespace"]
	_, hasPod := fields["pod"]
	_, hasName := fields["name"]
	merge := hasNS && (hasPod || hasName)
	args := make([]any, 0, 2*len(fields))
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		v := fields[k]
		switch {
		case merge && k == "namespace":
			continue
		case merge && (k == "pod" || k == "name"):
			k, v = "pod", fmt.Sprintf("%v/%v", ns, v)
		}
		args = append(args, k, v)
	}
	return slogAdapter{a.l.With(args...)}
}

func (a slogAdapter) WithError(err error) vklog.Logger {
	return slogAdapter{a.l.With("err", err)}
}

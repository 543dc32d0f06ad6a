//go:build !linux

package noderuntime

import (
	"context"
	"errors"
	"testing"

	"github.com/sandman-dev/sandman/runtime"
)

// TestUnsupportedOffLinux: off Linux every call says the runtime needs
// Linux, as an error that wraps errors.ErrUnsupported.
func TestUnsupportedOffLinux(t *testing.T) {
	ctx := context.Background()
	r := &Runtime{}
	for name, call := range map[string]func() error{
		"New":     func() error { _, err := New(ctx, Config{}); return err },
		"Run":     func() error { return r.Run(ctx) },
		"Bind":    func() error { _, err := r.Bind(ctx, runtime.BindRequest{}); return err },
		"Release": func() error { return r.Release(ctx, "uid", 0) },
		"Watch":   func() error { _, _, err := r.Watch(ctx); return err },
		"Stats":   func() error { _, err := r.Stats(ctx, "uid"); return err },
		"Snapshot": func() error {
			_, err := r.Snapshot(ctx, runtime.SnapshotRequest{}, nil)
			return err
		},
		"Drain":     func() error { return r.Drain(ctx, "why") },
		"PrePull":   func() error { return r.PrePull(ctx, nil) },
		"Close":     func() error { return r.Close(ctx) },
		"GuardPort": func() error { _, err := GuardPort("10.0.0.0/24", 1); return err },
	} {
		if err := call(); !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("%s: %v, want an error wrapping errors.ErrUnsupported", name, err)
		}
	}
}

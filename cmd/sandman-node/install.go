package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// installBinaries copies the daemon, runc and runsc from the agent's image
// to the host paths --daemon-path, --runc and --runsc, for each whose
// --*-source is given.
func installBinaries(o options) error {
	if o.daemonSource != "" {
		if err := installBinary(o.daemonSource, o.daemonPath); err != nil {
			return fmt.Errorf("--daemon-source, --daemon-path: %w", err)
		}
	}
	if o.runcSource != "" {
		if err := installBinary(o.runcSource, o.runc); err != nil {
			return fmt.Errorf("--runc-source, --runc: %w", err)
		}
	}
	if o.runscSource != "" {
		if err := installBinary(o.runscSource, o.runsc); err != nil {
			return fmt.Errorf("--runsc-source, --runsc: %w", err)
		}
	}
	return nil
}

// removeBinaries removes what installBinaries installed.
func removeBinaries(o options) error {
	var errs []error
	if o.daemonSource != "" {
		errs = append(errs, os.Remove(o.daemonPath))
	}
	if o.runcSource != "" {
		errs = append(errs, os.Remove(o.runc))
	}
	if o.runscSource != "" {
		errs = append(errs, os.Remove(o.runsc))
	}
	return errors.Join(errs...)
}

// installBinary copies a binary from the agent's image (the daemon, runc)
// to the host path sandboxes mount it from or the shim runs it from. The
// new file replaces the old by rename, so sandboxes that mounted the old
// one keep it.
func installBinary(src, dst string) (retErr error) {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(dst), "."+filepath.Base(dst)+"-*")
	if err != nil {
		return err
	}
	defer func() {
		if retErr != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := io.Copy(tmp, in); err != nil {
		tmp.Close()
		return fmt.Errorf("copy %s to %s: %w", src, dst, err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), dst)
}

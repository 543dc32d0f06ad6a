package main

import (
	"context"
	"io"
	"os"
	"path/filepath"

	"github.com/sandman-dev/sandman/daemon/archive"
)

// cp copies a file or a directory into or out of a sandbox.
func (c *ctl) cp(ctx context.Context, args []string) error {
	if len(args) != 2 {
		return fail(exitUsage, "cp: give SRC DST (NAME:/path for a sandbox path)")
	}
	sName, sPath, sRemote := splitRemote(args[0])
	dName, dPath, dRemote := splitRemote(args[1])
	switch {
	case sRemote == dRemote:
		return fail(exitUsage, "cp: exactly one of SRC and DST must be a sandbox path (NAME:/path)")
	case dRemote: // upload
		d, err := c.daemon(ctx, dName)
		if err != nil {
			return err
		}
		fi, err := os.Stat(sPath)
		if err != nil {
			return fail(exitNotFound, "cp: %v", err)
		}
		if fi.IsDir() {
			pr, pw := io.Pipe()
			go func() { _ = pw.CloseWithError(archive.Write(pw, sPath)) }()
			_, err = d.UploadTar(ctx, dPath, pr)
			return err
		}
		f, err := os.Open(sPath)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = d.WriteFile(ctx, dPath, f, fi.Mode().Perm())
		return err
	default: // download
		d, err := c.daemon(ctx, sName)
		if err != nil {
			return err
		}
		st, err := d.Stat(ctx, sPath)
		if err != nil {
			return err
		}
		if st.Type == "dir" {
			r, err := d.DownloadTar(ctx, sPath)
			if err != nil {
				return err
			}
			defer r.Close()
			_, err = archive.Extract(r, dPath)
			return err
		}
		r, err := d.ReadFile(ctx, sPath)
		if err != nil {
			return err
		}
		defer r.Close()
		if fi, err := os.Stat(dPath); err == nil && fi.IsDir() {
			dPath = filepath.Join(dPath, filepath.Base(sPath))
		}
		f, err := os.OpenFile(dPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
		if err != nil {
			return err
		}
		if _, err := io.Copy(f, r); err != nil {
			f.Close()
			return err
		}
		return f.Close()
	}
}

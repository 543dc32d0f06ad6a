package archive

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
)

// Write writes the tree under dir to w as a tar archive, names relative to
// dir (dir itself is not an entry), and ends the archive. It does not close
// w. A file that shrinks while it is read, or an unreadable directory, ends
// the archive early with an error: the caller must not take a short archive
// for a whole one.
func Write(w io.Writer, dir string) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	tw := tar.NewWriter(w)
	fsys := root.FS()
	err = fs.WalkDir(fsys, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if name == "." {
			return nil
		}
		fi, err := d.Info() // lstat: a link is a link
		if err != nil {
			return err
		}
		var link string
		switch mode := fi.Mode(); {
		case mode.IsDir(), mode.IsRegular():
		case mode&fs.ModeSymlink != 0:
			if link, err = fs.ReadLink(fsys, name); err != nil {
				return err
			}
		default:
			return nil // sockets, devices, FIFOs: skipped (see the package doc)
		}
		if fi.Mode().IsRegular() {
			return writeFile(tw, root, name)
		}
		hdr, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		hdr.Name = name
		if fi.IsDir() {
			hdr.Name += "/"
		}
		return tw.WriteHeader(hdr)
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// writeFile writes a regular file's header and content. The header is the
// open file's, so a file replaced since the walk saw it is written as it is
// now, and one that is gone or no longer a regular file is skipped; what a file grew
// by while it is read is left out.
func writeFile(tw *tar.Writer, root *os.Root, name string) error {
	f, err := root.OpenFile(name, os.O_RDONLY|readFlags, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return nil // removed since the walk saw it
	}
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() {
		return nil
	}
	hdr, err := tar.FileInfoHeader(fi, "")
	if err != nil {
		return err
	}
	hdr.Name = name
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
		return fmt.Errorf("%s: %w (it shrank while it was archived?)", name, err)
	}
	return nil
}

package archive

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

var (
	// ErrUnsafe: an entry would land outside the destination.
	ErrUnsafe = errors.New("unsafe tar entry")
	// ErrBadArchive: the stream is not a readable tar archive. The cause
	// (a read error, a malformed header) is wrapped too.
	ErrBadArchive = errors.New("bad tar archive")
)

// maxLinkHops bounds the symbolic links followed to resolve one path.
const maxLinkHops = 40

// Extract unpacks the tar stream r into dir (created with its parents) and
// returns how many entries it wrote (directories, files and links). A
// regular file is written beside its name and renamed over it, so a file
// or link already there is replaced, never written through. Directories
// get their modes and times once everything inside them is written. On an
// error, the entries before the failing one stay.
func Extract(r io.Reader, dir string) (int, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	x := extractor{root: root, dir: dir}
	tr := tar.NewReader(r)
	n := 0
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return n, x.finishDirs()
		}
		if err != nil {
			return n, fmt.Errorf("%w after %d entries: %w", ErrBadArchive, n, err)
		}
		wrote, err := x.entry(hdr, tr)
		if err != nil {
			return n, err
		}
		if wrote {
			n++
		}
	}
}

type extractor struct {
	root *os.Root
	dir  string
	// dirs are the directory entries, given their modes and times at the end.
	dirs []dirEntry
}

type dirEntry struct {
	name string // cleaned, relative to the destination
	hdr  *tar.Header
}

// entry writes one entry; wrote is false for what archives skip.
func (x *extractor) entry(hdr *tar.Header, body io.Reader) (wrote bool, err error) {
	name, err := x.localName(hdr.Name)
	if err != nil || name == "." {
		return false, err
	}
	switch hdr.Typeflag {
	case tar.TypeDir, tar.TypeReg, tar.TypeSymlink, tar.TypeLink:
	default:
		return false, nil // devices, FIFOs, global headers: not carried
	}
	parent := path.Dir(name)
	if err := x.inside(hdr.Name, parent); err != nil {
		return false, err
	}
	if err := x.root.MkdirAll(parent, 0o755); err != nil {
		return false, err
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		// A directory already there may be reached through a link.
		if err := x.inside(hdr.Name, name); err != nil {
			return false, err
		}
		if err := x.root.MkdirAll(name, 0o755); err != nil {
			return false, err
		}
		x.dirs = append(x.dirs, dirEntry{name, hdr})
	case tar.TypeReg:
		if err := x.file(name, hdr, body); err != nil {
			return false, err
		}
	case tar.TypeSymlink:
		if err := x.replace(name); err != nil {
			return false, err
		}
		if err := x.root.Symlink(hdr.Linkname, name); err != nil {
			return false, err
		}
	case tar.TypeLink:
		old, err := x.localName(hdr.Linkname)
		if err != nil {
			return false, err
		}
		if err := x.inside(hdr.Linkname, path.Dir(old)); err != nil {
			return false, err
		}
		if err := x.replace(name); err != nil {
			return false, err
		}
		if err := x.root.Link(old, name); err != nil {
			return false, err
		}
	}
	return true, nil
}

// localName checks an entry's name and returns it cleaned, relative to the
// destination ("." for the destination itself).
func (x *extractor) localName(name string) (string, error) {
	if strings.HasPrefix(name, "/") || filepath.IsAbs(name) {
		return "", fmt.Errorf("%w: %q is absolute", ErrUnsafe, name)
	}
	if slices.Contains(strings.Split(name, "/"), "..") {
		return "", fmt.Errorf("%w: %q has a .. element", ErrUnsafe, name)
	}
	clean := path.Clean(name)
	if clean != "." && !filepath.IsLocal(filepath.FromSlash(clean)) {
		return "", fmt.Errorf("%w: %q is not a local name", ErrUnsafe, name)
	}
	return clean, nil
}

// inside checks that the directory p (relative to the destination), with
// the links on its way resolved as they are now, stays in the destination.
// The os.Root refuses the same; this says so as ErrUnsafe, naming the entry.
func (x *extractor) inside(entry, p string) error {
	var at []string // resolved components, none a link
	todo := strings.Split(p, "/")
	for hops := 0; len(todo) > 0; {
		c := todo[0]
		todo = todo[1:]
		switch c {
		case "", ".":
			continue
		case "..":
			if len(at) == 0 {
				return fmt.Errorf("%w: %q would be written outside %s through a link", ErrUnsafe, entry, x.dir)
			}
			at = at[:len(at)-1]
			continue
		}
		cur := path.Join(append(at, c)...)
		fi, err := x.root.Lstat(cur)
		if errors.Is(err, fs.ErrNotExist) {
			return nil // the rest is made as directories
		}
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			at = append(at, c)
			continue
		}
		if hops++; hops > maxLinkHops {
			return fmt.Errorf("%w: %q: too many links", ErrUnsafe, entry)
		}
		target, err := x.root.Readlink(cur)
		if err != nil {
			return err
		}
		target = filepath.ToSlash(target)
		if strings.HasPrefix(target, "/") || filepath.IsAbs(target) {
			return fmt.Errorf("%w: %q would be written through the absolute link %s -> %s", ErrUnsafe, entry, cur, target)
		}
		todo = append(strings.Split(target, "/"), todo...)
	}
	return nil
}

// replace removes what is at name unless it is a directory, so a link can
// take its place.
func (x *extractor) replace(name string) error {
	fi, err := x.root.Lstat(name)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return err
	case fi.IsDir():
		return fmt.Errorf("%s: %w", name, syscall.EISDIR)
	}
	return x.root.Remove(name)
}

// file writes a regular file beside name and renames it over name.
func (x *extractor) file(name string, hdr *tar.Header, body io.Reader) (retErr error) {
	var f *os.File
	var tmp string
	for range 10 {
		tmp = path.Join(path.Dir(name), "."+path.Base(name)+".sandman-"+strconv.FormatUint(rand.Uint64(), 36))
		var err error
		f, err = x.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			break
		}
		if !errors.Is(err, fs.ErrExist) {
			return err
		}
	}
	if f == nil {
		return fmt.Errorf("%s: no free temporary name", name)
	}
	defer func() {
		if retErr != nil {
			f.Close()
			_ = x.root.Remove(tmp)
		}
	}()
	src := &readErr{r: body}
	if _, err := io.Copy(f, src); err != nil {
		if src.err != nil {
			return fmt.Errorf("%w: %s: %w", ErrBadArchive, hdr.Name, src.err)
		}
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := f.Chmod(hdr.FileInfo().Mode().Perm()); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := x.root.Chtimes(tmp, atime(hdr), hdr.ModTime); err != nil {
		return err
	}
	return x.root.Rename(tmp, name)
}

// finishDirs gives directories their modes and times once nothing more is
// made in them, deepest first (a parent made unreadable would hide its
// children).
func (x *extractor) finishDirs() error {
	slices.SortStableFunc(x.dirs, func(a, b dirEntry) int {
		return strings.Count(b.name, "/") - strings.Count(a.name, "/")
	})
	for _, d := range x.dirs {
		if fi, err := x.root.Lstat(d.name); err != nil || !fi.IsDir() {
			continue // replaced by a later entry
		}
		if err := x.root.Chmod(d.name, d.hdr.FileInfo().Mode().Perm()); err != nil {
			return err
		}
		if err := x.root.Chtimes(d.name, atime(d.hdr), d.hdr.ModTime); err != nil {
			return err
		}
	}
	return nil
}

func atime(hdr *tar.Header) time.Time {
	if hdr.AccessTime.IsZero() {
		return hdr.ModTime
	}
	return hdr.AccessTime
}

// readErr remembers the error its reader returned, to tell a broken
// archive from a failed write.
type readErr struct {
	r   io.Reader
	err error
}

func (e *readErr) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF {
		e.err = err
	}
	return n, err
}

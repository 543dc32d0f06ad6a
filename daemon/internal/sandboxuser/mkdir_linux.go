package sandboxuser

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// Dirs are the directories a MkdirAll made, outermost first, held until
// the call that needed them keeps them (Keep) or takes them back (Undo).
// A nil *Dirs made none.
type Dirs struct {
	u    *User
	made []madeDir
}

// madeDir is one directory MkdirAll made.
type madeDir struct {
	path string
	// parent is set for a directory the daemon made and handed over
	// (handOver): the directory it was made in, opened by the user, through
	// which Undo removes it (the user may not write there).
	parent *os.File
}

// MkdirAll makes dir and its missing parents for u, mode 0755, all u's.
// A directory is made with u's credentials (Do) wherever the kernel lets
// u make it. Where it does not, because u may not write to the directory
// it goes in (a new top-level /newdir, where / is root's), the daemon,
// when it runs as root, makes it and hands it over to u, as E2B's envd
// does when it "ensures the directories" of a file call, so that writing
// /newdir/a.txt as a user works as it does on E2B.
//
// The rule, and why it is safe:
//   - Only a directory that did not exist is made and handed over. An
//     existing one, root's or anyone's, is used as it is, never chowned:
//     writing into an existing directory still needs u's own permission,
//     so u gains no access to anything that was there.
//   - u must reach the place on its own: u has looked the new directory
//     up in its parent and found it missing (which needs search permission
//     on every directory above), and the parent the daemon makes it in is
//     the one u opened then (an O_PATH descriptor), so a symbolic link
//     swapped into the path afterwards cannot move the daemon elsewhere.
//   - The daemon makes the directory with mkdirat in that descriptor (a
//     name that exists meanwhile, a link included, is left alone: EEXIST),
//     opens what it made with O_NOFOLLOW, checks that it is a directory
//     of the daemon's own, and chowns that descriptor, never a path.
//   - u may not write to that parent, so nobody but root can swap the new
//     entry between mkdirat and open.
//
// Nothing but directories is made this way: the file a call writes is
// still created with u's credentials, in a directory u now owns. When the
// daemon is not root, or u is root or the daemon's own user, MkdirAll is a
// plain mkdir -p with u's credentials. On an error nothing it made stays.
func (u *User) MkdirAll(dir string) (_ *Dirs, retErr error) {
	d := &Dirs{u: u}
	defer func() {
		if retErr != nil {
			d.Undo()
		}
	}()
	// Asked here, not in Do: there the thread's ids are u's.
	mayHandOver := u.mayHandOver()
	var todo []string
	if err := u.Do(func() (err error) {
		todo, err = missingDirs(dir)
		return err
	}); err != nil {
		return nil, err
	}
	for len(todo) > 0 {
		// stuck is the parent of todo[0], which u may not write to.
		var stuck *os.File
		if err := u.Do(func() error {
			for ; len(todo) > 0; todo = todo[1:] {
				p := todo[0]
				err := os.Mkdir(p, 0o755)
				switch {
				case err == nil:
					d.made = append(d.made, madeDir{path: p})
				case errors.Is(err, fs.ErrExist):
					if fi, serr := os.Stat(p); serr != nil || !fi.IsDir() {
						return err
					}
					// made meanwhile by someone else: used, not ours
				case errors.Is(err, fs.ErrPermission) && mayHandOver:
					f, ferr := openParent(p)
					if ferr != nil {
						return err // u cannot reach it after all: its own error
					}
					stuck = f
					return nil
				default:
					return err
				}
			}
			return nil
		}); err != nil {
			return nil, err
		}
		if stuck != nil {
			if err := d.handOver(stuck, todo[0]); err != nil {
				return nil, err
			}
			todo = todo[1:]
		}
	}
	return d, nil
}

// missingDirs lists the directories of dir that do not exist, outermost
// first; an existing one that is not a directory is an ENOTDIR.
func missingDirs(dir string) ([]string, error) {
	var todo []string
	for p := filepath.Clean(dir); ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err == nil {
			if !fi.IsDir() {
				return nil, &fs.PathError{Op: "mkdir", Path: p, Err: syscall.ENOTDIR}
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		todo = append([]string{p}, todo...)
		if p == "/" || p == "." {
			break
		}
	}
	return todo, nil
}

// openParent opens the directory p goes in, as the caller (run through
// Do), for the daemon to make p in: an O_PATH descriptor, taken only if
// the caller can search it and finds p missing there.
func openParent(p string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Dir(p), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstatat(int(f.Fd()), filepath.Base(p), &st, unix.AT_SYMLINK_NOFOLLOW); !errors.Is(err, unix.ENOENT) {
		f.Close()
		if err == nil {
			err = unix.EEXIST
		}
		return nil, err
	}
	return f, nil
}

// mayHandOver reports whether the daemon can make directories for u
// where u may not: it runs as root, and u is another user than root. It
// reads the calling thread's effective uid: call it outside Do.
func (u *User) mayHandOver() bool {
	return u.Name != "" && u.UID != 0 && os.Geteuid() == 0
}

// handOver makes p in parent (u's descriptor of p's parent) with the
// daemon's credentials and gives it to u; parent is kept (Undo removes p
// through it) or closed.
func (d *Dirs) handOver(parent *os.File, p string) (retErr error) {
	pfd, name := int(parent.Fd()), filepath.Base(p)
	defer func() {
		if retErr != nil {
			parent.Close()
		}
	}()
	if err := unix.Mkdirat(pfd, name, 0o755); err != nil {
		if errors.Is(err, unix.EEXIST) {
			// Made meanwhile by someone else: not ours to hand over. What
			// goes into it next needs u's own permission.
			parent.Close()
			return nil
		}
		return &fs.PathError{Op: "mkdir", Path: p, Err: err}
	}
	undo := func() { _ = unix.Unlinkat(pfd, name, unix.AT_REMOVEDIR) }
	fd, err := unix.Openat(pfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		undo()
		return &fs.PathError{Op: "open", Path: p, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		undo()
		return &fs.PathError{Op: "stat", Path: p, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || int(st.Uid) != os.Geteuid() {
		return fmt.Errorf("make %s for user %q: it changed while it was made; not handed over: %w", p, d.u.Name, fs.ErrPermission)
	}
	if err := unix.Fchown(fd, d.u.UID, d.u.GID); err != nil {
		undo()
		return &fs.PathError{Op: "chown", Path: p, Err: err}
	}
	d.made = append(d.made, madeDir{path: p, parent: parent})
	return nil
}

// Made lists the directories made, outermost first.
func (d *Dirs) Made() []string {
	if d == nil {
		return nil
	}
	out := make([]string, 0, len(d.made))
	for _, m := range d.made {
		out = append(out, m.path)
	}
	return out
}

// Keep keeps the directories made.
func (d *Dirs) Keep() {
	if d == nil {
		return
	}
	for _, m := range d.made {
		if m.parent != nil {
			m.parent.Close()
		}
	}
	d.made = nil
}

// Undo removes the directories made, innermost first, if they are still
// empty: those u made with u's credentials, those handed over through the
// descriptor of the directory they were made in.
func (d *Dirs) Undo() {
	if d == nil {
		return
	}
	for i := len(d.made) - 1; i >= 0; i-- {
		m := d.made[i]
		if m.parent != nil {
			_ = unix.Unlinkat(int(m.parent.Fd()), filepath.Base(m.path), unix.AT_REMOVEDIR)
			m.parent.Close()
			continue
		}
		_ = d.u.Do(func() error { return os.Remove(m.path) })
	}
	d.made = nil
}

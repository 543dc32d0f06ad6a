package sandboxuser

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// TestMkdirAllOwn: for the daemon's own user, a plain mkdir -p whose
// directories Undo takes back and Keep keeps.
func TestMkdirAllOwn(t *testing.T) {
	own := &User{UID: os.Geteuid(), GID: os.Getegid()}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "file"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "have"), 0o755); err != nil {
		t.Fatal(err)
	}

	d, err := own.MkdirAll(filepath.Join(dir, "have/a/b"))
	if err != nil {
		t.Fatal(err)
	}
	want := []string{filepath.Join(dir, "have/a"), filepath.Join(dir, "have/a/b")}
	if got := d.Made(); !slices.Equal(got, want) {
		t.Errorf("made %v, want %v", got, want)
	}
	d.Undo()
	if _, err := os.Stat(filepath.Join(dir, "have/a")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Undo: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "have")); err != nil {
		t.Errorf("Undo removed what was there: %v", err)
	}

	d, err = own.MkdirAll(filepath.Join(dir, "k/l"))
	if err != nil {
		t.Fatal(err)
	}
	d.Keep()
	if fi, err := os.Stat(filepath.Join(dir, "k/l")); err != nil || !fi.IsDir() {
		t.Errorf("after Keep: %v", err)
	}
	if d, err := own.MkdirAll(filepath.Join(dir, "k/l")); err != nil || len(d.Made()) != 0 {
		t.Errorf("an existing directory: made %v, %v", d.Made(), err)
	}

	if _, err := own.MkdirAll(filepath.Join(dir, "file/x")); !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("under a file: %v, want ENOTDIR", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "file/x")); !errors.Is(err, syscall.ENOTDIR) {
		t.Errorf("under a file: made something (%v)", err)
	}
}

// rootFor skips unless the test runs as root, and returns a user of uid
// 65534 (no /etc/passwd needed: MkdirAll takes the ids it is given).
func rootFor(t *testing.T) *User {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("making directories for another user needs root (the unit tier may run unprivileged; the root tier runs it)")
	}
	return &User{Name: "nobody", UID: 65534, GID: 65534, Groups: []int{}}
}

func owner(t *testing.T, p string) [2]int {
	t.Helper()
	fi, err := os.Lstat(p)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	return [2]int{int(st.Uid), int(st.Gid)}
}

// TestMkdirAllHandOver: where the user may not make a directory, the root
// daemon makes it and hands it over; the rest the user makes; what was
// there stays as it was; Undo takes all of it back.
func TestMkdirAllHandOver(t *testing.T) {
	u := rootFor(t)
	user := [2]int{u.UID, u.GID}
	dir := t.TempDir()
	for _, p := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(p, 0o755); err != nil { // root's, searchable
			t.Fatal(err)
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "private"), 0o700); err != nil {
		t.Fatal(err)
	}

	d, err := u.MkdirAll(filepath.Join(dir, "top/a/b"))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"top", "top/a", "top/a/b"} {
		if got := owner(t, filepath.Join(dir, p)); got != user {
			t.Errorf("%s owned by %v, want %v", p, got, user)
		}
	}
	if got := owner(t, dir); got != [2]int{0, 0} {
		t.Errorf("the existing parent was chowned to %v", got)
	}
	if len(d.Made()) != 3 || d.made[0].parent == nil || d.made[1].parent != nil {
		t.Errorf("made %+v: want top handed over, the rest made by the user", d.made)
	}
	d.Undo()
	if _, err := os.Stat(filepath.Join(dir, "top")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Undo: %v", err)
	}

	// A directory the user cannot search is not made in.
	if _, err := u.MkdirAll(filepath.Join(dir, "private/x")); !errors.Is(err, os.ErrPermission) {
		t.Errorf("under root's 0700 directory: %v, want permission denied", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "private/x")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("under root's 0700 directory: made something (%v)", err)
	}

	// Without root, nothing is handed over.
	own := *u
	own.Name = "" // acts as the daemon itself: root, who needs no hand-over
	d, err = own.MkdirAll(filepath.Join(dir, "byroot"))
	if err != nil {
		t.Fatal(err)
	}
	d.Keep()
	if got := owner(t, filepath.Join(dir, "byroot")); got != [2]int{0, 0} {
		t.Errorf("made by the daemon for itself, owned by %v", got)
	}
}

// TestHandOverLeavesWhatIsThere: what appears at the name between the
// user's look and the daemon's mkdirat, a directory of root's or a link
// to one, is neither chowned nor followed.
func TestHandOverLeavesWhatIsThere(t *testing.T) {
	u := rootFor(t)
	dir := t.TempDir()
	target := filepath.Join(dir, "etc")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(target, filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"etc", "link"} {
		parent, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
		if err != nil {
			t.Fatal(err)
		}
		d := &Dirs{u: u}
		if err := d.handOver(parent, filepath.Join(dir, name)); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if len(d.made) != 0 {
			t.Errorf("%s: handed over %+v", name, d.made)
		}
		for _, p := range []string{target, filepath.Join(dir, "link")} {
			if got := owner(t, p); got != [2]int{0, 0} {
				t.Errorf("%s: %s now owned by %v", name, p, got)
			}
		}
	}
	// A new name is made, handed over, and taken back through the parent.
	parent, err := os.OpenFile(dir, unix.O_PATH|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	d := &Dirs{u: u}
	if err := d.handOver(parent, filepath.Join(dir, "new")); err != nil {
		t.Fatal(err)
	}
	if got := owner(t, filepath.Join(dir, "new")); got != [2]int{u.UID, u.GID} {
		t.Errorf("new owned by %v", got)
	}
	d.Undo()
	if _, err := os.Lstat(filepath.Join(dir, "new")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after Undo: %v", err)
	}
}

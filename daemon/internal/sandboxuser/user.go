// Package sandboxuser is who the daemon acts for inside the sandbox: the
// sandbox's accounts (its own /etc/passwd and /etc/group, read as they are
// now), what "~" and relative paths mean for each, the environment's
// variables, and the credentials a command or a file operation takes to
// be that user.
package sandboxuser

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

// The sandbox's account databases (the daemon runs in the sandbox).
const (
	PasswdFile = "/etc/passwd"
	GroupFile  = "/etc/group"
)

var (
	// ErrUnknown: a call names a user the sandbox does not have (or whose
	// /etc/passwd cannot be read).
	ErrUnknown = errors.New("unknown user")
	// ErrMalformed: the line of /etc/passwd that names a user has no
	// numeric uid or gid.
	ErrMalformed = errors.New("malformed passwd entry")
)

// User is who a call acts as.
type User struct {
	// Name is "" for the daemon's own user.
	Name     string
	UID, GID int
	// Groups are the supplementary groups from /etc/group (nil for the
	// daemon's own user: its own groups).
	Groups []int
	// Home is what "~" means.
	Home string
	// Base is where relative paths start.
	Base string
}

// For is the user a call names: "" is the daemon's own user, whose "~" is
// $HOME of env (else dir) and whose relative paths start at dir, the
// sandbox's working directory; a name is looked up (Lookup), and its
// relative paths start at its home, as in envd.
func For(name string, env []string, dir string) (*User, error) {
	if name == "" {
		home := Env(env, "HOME")
		if home == "" {
			home = dir
		}
		return &User{UID: os.Geteuid(), GID: os.Getegid(), Home: home, Base: dir}, nil
	}
	return Lookup(name)
}

// Lookup finds name in the sandbox's /etc/passwd and its supplementary
// groups in /etc/group. root is uid 0 with home /root even without an
// entry. An account without a home has "/".
func Lookup(name string) (*User, error) {
	u, err := passwdEntry(PasswdFile, name)
	if err != nil && name == "root" {
		u, err = &User{Name: "root", Home: "/root"}, nil
	}
	if err != nil {
		return nil, err
	}
	if u.Home == "" {
		u.Home = "/"
	}
	u.Base = u.Home
	u.Groups = supplementaryGroups(GroupFile, u.Name, u.GID)
	return u, nil
}

// passwdEntry reads name's line of a passwd file (name:password:uid:gid:
// gecos:home:shell).
func passwdEntry(path, name string) (*User, error) {
	f, err := os.Open(path)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return nil, fmt.Errorf("user %q: %w: this sandbox has no readable %s (%v); send no user to act as the default one", name, ErrUnknown, path, err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) < 7 || fields[0] != name {
			continue
		}
		uid, err1 := strconv.ParseUint(fields[2], 10, 32)
		gid, err2 := strconv.ParseUint(fields[3], 10, 32)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("user %q: %w in %s", name, ErrMalformed, path)
		}
		return &User{Name: name, UID: int(uid), GID: int(gid), Home: fields[5]}, nil
	}
	return nil, fmt.Errorf("user %q: %w: it is not in this sandbox's %s; send an existing user, or none for the default one", name, ErrUnknown, path)
}

// supplementaryGroups lists the groups of a group file that name is a
// member of, but its primary group. A missing file means none.
func supplementaryGroups(path, name string, primary int) []int {
	out := []int{}
	f, err := os.Open(path)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// name:password:gid:member,member
		fields := strings.Split(sc.Text(), ":")
		if len(fields) < 4 || !slices.Contains(strings.Split(fields[3], ","), name) {
			continue
		}
		if gid, err := strconv.ParseUint(fields[2], 10, 32); err == nil && int(gid) != primary && !slices.Contains(out, int(gid)) {
			out = append(out, int(gid))
		}
	}
	return out
}

// Resolve turns a path a call names into an absolute, clean one, as envd
// does: "~" and "~/…" start at the user's home, a relative path at the
// user's base directory, and "" is the base directory itself. ".." is
// resolved lexically, as a shell's cd does. A path with a NUL byte, or
// one naming another user's home (~user), is refused (an EINVAL).
func (u *User) Resolve(p string) (string, error) {
	switch {
	case strings.ContainsRune(p, 0):
		return "", badPath(fmt.Sprintf("path %q contains a NUL byte", p))
	case p == "":
		return filepath.Clean(u.Base), nil
	case p == "~" || strings.HasPrefix(p, "~/"):
		return filepath.Join(u.Home, p[1:]), nil
	case strings.HasPrefix(p, "~"):
		return "", badPath(fmt.Sprintf("path %q: ~user is not expanded; write the home directory out, or use ~/ for the caller's own", p))
	case !filepath.IsAbs(p):
		return filepath.Join(u.Base, p), nil
	}
	return filepath.Clean(p), nil
}

// badPath is a path Resolve refuses: an EINVAL, with its own message.
type badPath string

func (e badPath) Error() string        { return string(e) }
func (e badPath) Is(target error) bool { return target == syscall.EINVAL }

// Credential is what a child runs as to be u: nothing to change when the
// daemon is u already; root may become anyone; others cannot
// (ErrCannotActAs).
func (u *User) Credential() (*syscall.Credential, error) {
	euid, egid := os.Geteuid(), os.Getegid()
	switch {
	case u.UID == euid && u.GID == egid:
		return nil, nil
	case euid != 0:
		return nil, u.cannotActAs(euid)
	}
	groups := make([]uint32, 0, len(u.Groups))
	for _, g := range u.Groups {
		groups = append(groups, uint32(g))
	}
	return &syscall.Credential{Uid: uint32(u.UID), Gid: uint32(u.GID), Groups: groups}, nil
}

func (u *User) cannotActAs(euid int) error {
	return fmt.Errorf("user %q: %w: uid %d, while the daemon runs as uid %d, not root: name no user, or the daemon's own", u.Name, ErrCannotActAs, u.UID, euid)
}

// Do runs fn, which does the file work of a call, with u's filesystem
// credentials (see asUser): the kernel checks u's permissions, and what fn
// creates is u's.
func (u *User) Do(fn func() error) error {
	if u.Name == "" {
		return fn()
	}
	err := asUser(&fsCred{uid: u.UID, gid: u.GID, groups: u.Groups}, fn)
	if errors.Is(err, ErrCannotActAs) {
		return fmt.Errorf("user %q: %w", u.Name, err)
	}
	return err
}

// Env is KEY's value in a KEY=VALUE list (the last one wins; "" when
// unset).
func Env(env []string, key string) string {
	v, _ := LookupEnv(env, key)
	return v
}

// LookupEnv is KEY's value in a KEY=VALUE list (the last one wins), and
// whether it is set.
func LookupEnv(env []string, key string) (string, bool) {
	for _, kv := range slices.Backward(env) {
		if v, ok := strings.CutPrefix(kv, key+"="); ok {
			return v, true
		}
	}
	return "", false
}

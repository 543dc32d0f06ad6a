package sandboxuser

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// threadCreds lists every thread's credentials, from
// /proc/self/task/*/status: its uids and gids (real, effective, saved,
// filesystem), groups and capability sets.
func threadCreds(t *testing.T) map[string]string {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join("/proc/self/task", task.Name(), "status"))
		if err != nil {
			continue // the thread ended meanwhile
		}
		var cred []string
		for _, line := range strings.Split(string(b), "\n") {
			k, v, _ := strings.Cut(line, ":")
			switch k {
			case "Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapAmb":
				cred = append(cred, k+"="+strings.Join(strings.Fields(v), ","))
			}
		}
		out[task.Name()] = strings.Join(cred, " ")
	}
	return out
}

// TestAsUser: the kernel checks what fn does against the credentials it
// runs with, root's overrides and root's groups included, the thread's
// real and saved uid stay root's meanwhile, and every thread is back to
// the daemon's credentials afterwards. TestRootAsUserGVisor runs it under
// gVisor too.
func TestAsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("taking another user's credentials needs root (the unit tier may run unprivileged; the root tier runs it)")
	}
	// user is E2B's base template's (uid 1000); no /etc/passwd is needed:
	// asUser takes the ids it is given.
	const user, group = 1000, 4242
	before := threadCreds(t)
	dir := t.TempDir() // root's 0700, under root's 0700: open both
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	write := func(name string, mode os.FileMode, uid, gid int) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(name), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, uid, gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	rootOnly := write("root-only", 0o600, 0, 0)
	rootOpen := write("root-open", 0o644, 0, 0)
	rootGroup := write("root-group", 0o640, 0, 0)
	ourGroup := write("our-group", 0o640, 0, group)
	mine := write("mine", 0o644, user, user)
	rootDir := filepath.Join(dir, "root-dir")
	if err := os.Mkdir(rootDir, 0o755); err != nil {
		t.Fatal(err)
	}
	read := func(p string) func() error {
		return func() error { _, err := os.ReadFile(p); return err }
	}
	overwrite := func(p string) func() error {
		return func() error { return os.WriteFile(p, []byte("x"), 0o644) }
	}
	plain := &fsCred{uid: user, gid: user, groups: []int{}}
	for _, tc := range []struct {
		name       string
		cred       *fsCred
		fn         func() error
		permission bool // want the kernel's permission denied, from the file operation
	}{
		{"the daemon's own reads a 0600 file of root's", nil, read(rootOnly), false},
		{"root by name reads a 0600 file of root's", &fsCred{uid: 0, gid: 0}, read(rootOnly), false},
		{"the user reads a 0600 file of root's", plain, read(rootOnly), true},
		{"the user reads a 0644 file of root's", plain, read(rootOpen), false},
		{"the user writes a 0644 file of root's", plain, overwrite(rootOpen), true},
		{"the user writes its own file", plain, overwrite(mine), false},
		{"the user makes a file in root's 0755 directory", plain, overwrite(filepath.Join(rootDir, "new")), true},
		{"the user does not keep root's groups", plain, read(rootGroup), true},
		{"the user in a group reads the group's file", &fsCred{uid: user, gid: user, groups: []int{group}}, read(ourGroup), false},
		{"the user outside the group does not", plain, read(ourGroup), true},
		{"the user with the group as its own reads it", &fsCred{uid: user, gid: group, groups: []int{}}, read(ourGroup), false},
		{"the user changes the mode of root's file", plain, func() error { return os.Chmod(rootOnly, 0o644) }, true},
		{"the user gives its own file to root", plain, func() error { return os.Chown(mine, 0, 0) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := asUser(tc.cred, tc.fn)
			var pe *fs.PathError
			denied := errors.As(err, &pe) && errors.Is(pe.Err, fs.ErrPermission)
			if denied != tc.permission || (!tc.permission && err != nil) {
				t.Fatalf("err %v, want the file operation's permission denied: %v", err, tc.permission)
			}
		})
	}

	// Meanwhile the thread's effective ids are the user's, its real and
	// saved uid root's, and it has no effective capabilities.
	var during string
	if err := asUser(&fsCred{uid: user, gid: group, groups: []int{group, 4243}}, func() error {
		b, err := os.ReadFile("/proc/thread-self/status")
		during = string(b)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Uid:\t0\t1000\t0\t1000\n", "Gid:\t0\t4242\t0\t4242\n", "CapEff:\t0000000000000000\n"} {
		if !strings.Contains(during, want) {
			t.Errorf("the thread's status during fn has no %q:\n%s", want, during)
		}
	}
	if !strings.Contains(during, "Groups:\t4242 4243") {
		t.Errorf("the thread's groups during fn are not the user's:\n%s", during)
	}

	// What fn creates is the user's.
	made := filepath.Join(dir, "made")
	if err := asUser(&fsCred{uid: user, gid: group, groups: []int{}}, func() error { return os.Mkdir(made, 0o755) }); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(made)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != user || st.Gid != group {
		t.Errorf("made by the user, owned by %d:%d", st.Uid, st.Gid)
	}

	// A panic in fn reaches the caller, and its thread is restored too.
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want fn's panic", p)
			}
		}()
		_ = asUser(plain, func() error { panic("boom") })
		t.Error("asUser returned after fn panicked")
	}()

	// Every thread has the daemon's credentials again.
	var want string
	for _, c := range before {
		want = c // all alike (checked below, through the threads that stay)
	}
	for tid, cred := range threadCreds(t) {
		if cred != want {
			t.Errorf("thread %s: %s, want the daemon's %s", tid, cred, want)
		}
	}
}

// BenchmarkAsUser is the cost of one switch and back, against a stat
// alone.
func BenchmarkAsUser(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("taking another user's credentials needs root")
	}
	stat := func() error { _, err := os.Stat("/"); return err }
	for _, bc := range []struct {
		name string
		cred *fsCred
	}{
		{"own", nil},
		{"user", &fsCred{uid: 1000, gid: 1000, groups: []int{}}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if err := asUser(bc.cred, stat); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

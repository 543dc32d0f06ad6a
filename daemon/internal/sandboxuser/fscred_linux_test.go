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

// threadCreds lists every thread's fsuid, fsgid and groups, from
// /proc/self/task/*/status ("Uid: real effective saved fs").
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
			switch f := strings.Fields(v); k {
			case "Uid", "Gid":
				cred = append(cred, k+"(fs)="+f[3])
			case "Groups":
				cred = append(cred, k+"="+strings.Join(f, ","))
			}
		}
		out[task.Name()] = strings.Join(cred, " ")
	}
	return out
}

// TestAsUser: the kernel checks what fn does against the credentials it
// runs with, root's overrides and root's groups included, and every
// thread is back to the daemon's credentials afterwards.
func TestAsUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("taking another user's credentials needs root (the unit tier may run unprivileged; the root tier runs it)")
	}
	const nobody, group = 65534, 4242
	before := threadCreds(t)
	dir := t.TempDir() // root's 0700, under root's 0700: open both
	if err := os.Chmod(filepath.Dir(dir), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	write := func(name string, mode os.FileMode, gid int) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(name), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(p, 0, gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	rootOnly := write("root-only", 0o600, 0)
	rootGroup := write("root-group", 0o640, 0)
	ourGroup := write("our-group", 0o640, group)
	read := func(p string) func() error {
		return func() error { _, err := os.ReadFile(p); return err }
	}
	for _, tc := range []struct {
		name       string
		cred       *fsCred
		fn         func() error
		permission bool // want permission denied
	}{
		{"the daemon's own reads a 0600 file of root's", nil, read(rootOnly), false},
		{"root by name reads a 0600 file of root's", &fsCred{uid: 0, gid: 0}, read(rootOnly), false},
		{"nobody reads a 0600 file of root's", &fsCred{uid: nobody, gid: nobody, groups: []int{}}, read(rootOnly), true},
		{"nobody does not keep root's groups", &fsCred{uid: nobody, gid: nobody, groups: []int{}}, read(rootGroup), true},
		{"nobody in a group reads the group's file", &fsCred{uid: nobody, gid: nobody, groups: []int{group}}, read(ourGroup), false},
		{"nobody outside the group does not", &fsCred{uid: nobody, gid: nobody, groups: []int{}}, read(ourGroup), true},
		{"nobody with the group as its own reads it", &fsCred{uid: nobody, gid: group, groups: []int{}}, read(ourGroup), false},
		{"nobody changes the mode of root's file", &fsCred{uid: nobody, gid: nobody, groups: []int{}}, func() error { return os.Chmod(rootOnly, 0o644) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := asUser(tc.cred, tc.fn)
			if got := errors.Is(err, fs.ErrPermission); got != tc.permission || (!tc.permission && err != nil) {
				t.Fatalf("err %v, want permission denied: %v", err, tc.permission)
			}
		})
	}

	// What fn creates is the user's.
	made := filepath.Join(dir, "made")
	if err := asUser(&fsCred{uid: nobody, gid: group, groups: []int{}}, func() error { return os.Mkdir(made, 0o755) }); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(made)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != nobody || st.Gid != group {
		t.Errorf("made by nobody, owned by %d:%d", st.Uid, st.Gid)
	}

	// A panic in fn reaches the caller, and its thread is restored too.
	func() {
		defer func() {
			if p := recover(); p != "boom" {
				t.Errorf("recovered %v, want fn's panic", p)
			}
		}()
		_ = asUser(&fsCred{uid: nobody, gid: nobody, groups: []int{}}, func() error { panic("boom") })
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
		{"nobody", &fsCred{uid: 65534, gid: 65534, groups: []int{}}},
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

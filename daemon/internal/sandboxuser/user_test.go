package sandboxuser

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
)

func TestResolve(t *testing.T) {
	u := &User{Name: "alice", Home: "/home/alice", Base: "/work"}
	for _, tc := range []struct {
		in, want string
		bad      bool
	}{
		{"", "/work", false},
		{"~", "/home/alice", false},
		{"~/a/../b", "/home/alice/b", false},
		{"rel/x", "/work/rel/x", false},
		{"../up", "/up", false},
		{"/abs//x/", "/abs/x", false},
		{"~bob/x", "", true},
		{"a\x00b", "", true},
	} {
		got, err := u.Resolve(tc.in)
		if tc.bad {
			if !errors.Is(err, syscall.EINVAL) {
				t.Errorf("Resolve(%q) = %q, %v; want an EINVAL", tc.in, got, err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("Resolve(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestFor(t *testing.T) {
	u, err := For("", []string{"HOME=/h1", "X=1", "HOME=/h2"}, "/d")
	if err != nil || u.Home != "/h2" || u.Base != "/d" || u.UID != os.Geteuid() {
		t.Errorf("For(\"\") = %+v, %v; want home /h2 (the last), base /d, the daemon's uid", u, err)
	}
	if u, _ := For("", nil, "/d"); u.Home != "/d" {
		t.Errorf("without HOME, ~ is %q, want the directory /d", u.Home)
	}
}

func TestLookupEnv(t *testing.T) {
	env := []string{"PATH=/a", "EMPTY=", "PATH=/b"}
	if v, ok := LookupEnv(env, "PATH"); v != "/b" || !ok {
		t.Errorf("PATH = %q, %v; want the last, /b", v, ok)
	}
	if v, ok := LookupEnv(env, "EMPTY"); v != "" || !ok {
		t.Errorf("EMPTY = %q, %v; want set and empty", v, ok)
	}
	if _, ok := LookupEnv(env, "PAT"); ok {
		t.Error("PAT is set, want unset (a prefix of PATH)")
	}
}

func TestPasswdAndGroups(t *testing.T) {
	dir := t.TempDir()
	passwd := filepath.Join(dir, "passwd")
	group := filepath.Join(dir, "group")
	write := func(p, s string) {
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(passwd, "root:x:0:0:root:/root:/bin/sh\nalice:x:1000:100::/home/alice:/bin/sh\nbad:x:x:1::/:/bin/sh\n")
	write(group, "users:x:100:alice\nwheel:x:10:root,alice\ndocker:x:999:bob\nwheel2:x:10:alice\n")
	u, err := passwdEntry(passwd, "alice")
	if err != nil || u.UID != 1000 || u.GID != 100 || u.Home != "/home/alice" {
		t.Fatalf("alice = %+v, %v", u, err)
	}
	if _, err := passwdEntry(passwd, "nobody-here"); !errors.Is(err, ErrUnknown) {
		t.Errorf("unknown user: %v, want ErrUnknown", err)
	}
	if _, err := passwdEntry(passwd, "bad"); !errors.Is(err, ErrMalformed) {
		t.Errorf("malformed line: %v, want ErrMalformed", err)
	}
	if _, err := passwdEntry(filepath.Join(dir, "none"), "alice"); !errors.Is(err, ErrUnknown) {
		t.Errorf("no passwd file: %v, want ErrUnknown", err)
	}
	// Not the primary group, each group once.
	if got := supplementaryGroups(group, "alice", 100); !slices.Equal(got, []int{10}) {
		t.Errorf("alice's groups = %v, want [10]", got)
	}
	if got := supplementaryGroups(filepath.Join(dir, "none"), "alice", 100); got == nil || len(got) != 0 {
		t.Errorf("no group file: %v, want an empty list (setgroups clears)", got)
	}
}

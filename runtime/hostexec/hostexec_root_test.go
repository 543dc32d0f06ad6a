//go:build root

package hostexec_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sandman-dev/sandman/runtime/hostexec"
)

func TestMain(m *testing.M) {
	hostexec.Main()
	os.Exit(m.Run())
}

// TestRootHostExecRunsHostPrograms execs a "plugin" and iptables through the
// shims, with the host root at / (the chroot changes nothing, the rest is
// as in a DaemonSet pod): the plugin sees the network namespace as an open
// descriptor and CNI_PATH as the host's plugin directory.
func TestRootHostExecRunsHostPrograms(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (chroot)")
	}
	for _, k := range []string{"PATH", "SANDMAN_HOSTEXEC_ROOT", "SANDMAN_HOSTEXEC_CNI_BIN", "SANDMAN_HOSTEXEC_SHIMS"} {
		t.Setenv(k, os.Getenv(k))
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "plugins")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	probe := "#!/bin/sh\necho \"netns=$CNI_NETNS path=$CNI_PATH\"\nreadlink \"$CNI_NETNS\"\n"
	if err := os.WriteFile(filepath.Join(bin, "probe"), []byte(probe), 0o755); err != nil {
		t.Fatal(err)
	}
	cniDir, err := hostexec.Setup(hostexec.Config{HostRoot: "/", CNIBinDir: bin, ShimDir: filepath.Join(dir, "shims")})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(filepath.Join(cniDir, "probe"))
	cmd.Env = append(os.Environ(), "CNI_COMMAND=ADD", "CNI_NETNS=/proc/self/ns/net", "CNI_PATH="+cniDir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("probe: %v: %s", err, out)
	}
	s := string(out)
	if !strings.Contains(s, "netns=/proc/self/fd/") || !strings.Contains(s, "path="+bin+"\n") || !strings.Contains(s, "net:[") {
		t.Fatalf("the plugin did not get the namespace descriptor and the host's plugin dir:\n%s", s)
	}

	ipt, err := exec.LookPath("iptables")
	if err != nil {
		t.Fatal(err)
	}
	if filepath.Dir(ipt) != filepath.Join(dir, "shims", "bin") {
		t.Fatalf("iptables resolves to %s, not the shim", ipt)
	}
	out, err = exec.Command("iptables", "--version").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "iptables v") {
		t.Fatalf("iptables through the shim: %v: %s", err, out)
	}

	// A shim whose program the host does not have fails with a message.
	if err := os.Symlink(filepath.Join(cniDir, "probe"), filepath.Join(cniDir, "gone")); err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(filepath.Join(cniDir, "gone")).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "run the host's gone") {
		t.Fatalf("a missing host plugin: %v: %s", err, out)
	}
}

//go:build root

package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sandman-dev/sandman/e2e/framework"
	"github.com/sandman-dev/sandman/runtime/noderuntime"
)

// TestRootSlotSetupFailureFreesAddress: a slot network whose setup fails
// after the IPAM plugin gave it an address (a later plugin of the chain
// fails) gets a CNI DEL, so the address is free again; nothing of the
// failed slots is held once the runtime stops.
func TestRootSlotSetupFailureFreesAddress(t *testing.T) {
	s := framework.Get(t)
	dir := t.TempDir()
	binDir, confDir, ipamDir := filepath.Join(dir, "bin"), filepath.Join(dir, "net.d"), filepath.Join(dir, "ipam")
	for _, d := range []string{binDir, confDir, ipamDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	plugins, err := os.ReadDir(s.CNIBinDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range plugins {
		if err := os.Symlink(filepath.Join(s.CNIBinDir, p.Name()), filepath.Join(binDir, p.Name())); err != nil {
			t.Fatal(err)
		}
	}
	// A plugin that fails every ADD and logs it; DEL and VERSION succeed.
	adds := filepath.Join(dir, "adds")
	script := fmt.Sprintf(`#!/bin/sh
case "$CNI_COMMAND" in
ADD) echo "$CNI_CONTAINERID" >> %s
     echo '{"cniVersion":"1.0.0","code":999,"msg":"injected ADD failure"}'; exit 1;;
VERSION) echo '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}';;
esac
exit 0
`, adds)
	if err := os.WriteFile(filepath.Join(binDir, "sandman-fail"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	const bridge = "sandmanft0"
	conf := fmt.Sprintf(`{"cniVersion": "1.0.0", "name": "sandman-fail", "plugins": [
  {"type": "bridge", "bridge": %q, "isGateway": false,
   "ipam": {"type": "host-local", "dataDir": %q, "ranges": [[{"subnet": "10.214.250.0/24"}]]}},
  {"type": "sandman-fail"}]}`, bridge, ipamDir)
	if err := os.WriteFile(filepath.Join(confDir, "10-fail.conflist"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	// Registered first, so it runs after the runtime's own cleanup has
	// stopped it (a setup under way then has ended).
	t.Cleanup(func() {
		defer func() { _ = exec.Command("ip", "link", "del", bridge).Run() }()
		held, _ := filepath.Glob(filepath.Join(ipamDir, "sandman-fail", "10.*"))
		for _, h := range held {
			b, _ := os.ReadFile(h)
			t.Errorf("address %s still held by %s", filepath.Base(h), strings.Fields(string(b)))
		}
	})
	newContainerdRuntime(t, s, 2, 2, func(c *noderuntime.Config) { c.CNIConfDir, c.CNIBinDir = confDir, binDir })
	framework.Eventually(t, time.Minute, "two failed slot setups", func(context.Context) (bool, error) {
		b, _ := os.ReadFile(adds)
		return strings.Count(string(b), "\n") >= 2, nil
	})
}

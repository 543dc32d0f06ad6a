//go:build root

package sandboxnet

import (
	"net/netip"
	"os"
	"os/exec"
	"testing"
)

// benchPolicy is a bound pod's: the pool's ranges, two ports, two peers.
var benchPolicy = Policy{
	Deny: SpecialRanges, Self: mustPrefixes("10.213.0.1"), DaemonPorts: []uint16{49983},
	TCPPorts:    []uint16{49983, 8080},
	IngressFrom: []Rule{{Peers: []Peer{{Prefix: netip.MustParsePrefix("10.244.1.5/32")}, {Prefix: netip.MustParsePrefix("10.244.1.6/32")}}}},
}

func benchNetns(b *testing.B) string {
	if os.Getuid() != 0 {
		b.Skip("needs root")
	}
	name := "sbxbench-" + b.Name()
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		b.Fatalf("ip netns add: %v %s", err, out)
	}
	b.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	return "/run/netns/" + name
}

// BenchmarkApply: a whole firewall replaced (what a policy change does):
// the deletion waits for a kernel grace period.
func BenchmarkApply(b *testing.B) {
	ns := benchNetns(b)
	for b.Loop() {
		if err := Apply(ns, benchPolicy); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAddPod: a pod's parts added to a slot's base (what a bind
// does; the reset to the base happens at release, off the bind's path).
func BenchmarkAddPod(b *testing.B) {
	ns := benchNetns(b)
	for b.Loop() {
		b.StopTimer()
		if err := Reset(ns, benchPolicy); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		if err := AddPod(ns, benchPolicy); err != nil {
			b.Fatal(err)
		}
	}
}

package noderuntime

import (
	"fmt"
	"strconv"

	"github.com/coreos/go-iptables/iptables"
)

// GuardPort keeps sandboxes (source addresses in slotCIDR) from reaching a
// TCP port on the node: an iptables INPUT rule that rejects them, inserted
// first. The node agent uses it for its API when that listens on an address
// sandboxes can route to. The returned function removes the rule.
func GuardPort(slotCIDR string, port int) (func() error, error) {
	ipt, err := iptables.New()
	if err != nil {
		return nil, fmt.Errorf("iptables: %w", err)
	}
	// Traffic from the host itself (to its own bridge address) comes in on
	// lo with a source in slotCIDR too: only sandboxes are rejected.
	rule := []string{"!", "-i", "lo", "-s", slotCIDR, "-p", "tcp", "--dport", strconv.Itoa(port),
		"-m", "comment", "--comment", "sandman-node: sandboxes may not reach the node API",
		"-j", "REJECT", "--reject-with", "tcp-reset"}
	exists, err := ipt.Exists("filter", "INPUT", rule...)
	if err != nil {
		return nil, fmt.Errorf("iptables: %w", err)
	}
	if !exists {
		if err := ipt.Insert("filter", "INPUT", 1, rule...); err != nil {
			return nil, fmt.Errorf("iptables: insert the node API guard: %w", err)
		}
	}
	return func() error { return ipt.DeleteIfExists("filter", "INPUT", rule...) }, nil
}

//go:build !linux

package noderuntime

// GuardPort needs iptables, which only Linux has: off Linux it returns
// errUnsupported.
func GuardPort(slotCIDR string, port int) (func() error, error) {
	return nil, errUnsupported
}

package sandboxnet

import (
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Bandwidth caps a sandbox's traffic in bits per second (0: no cap), as
// the pod annotations kubernetes.io/ingress-bandwidth and egress-bandwidth
// do for the CNI bandwidth plugin. Both are token-bucket (tbf) queues, so
// a sender slows down rather than loses packets: egress on the sandbox's
// interface in its namespace; ingress on the node's end of its veth (the
// queue towards the sandbox), which needs no classifier or policer in the
// node's kernel. A slot whose interface is not a veth cannot cap ingress.
type Bandwidth struct {
	Ingress, Egress int64
}

// tbfLatency bounds how long a packet may wait in a queue.
const tbfLatencyMicros = 25_000

// SetBandwidth replaces the caps on every interface but the loopback of
// the network namespace at nsPath (removing them where b says 0).
func SetBandwidth(nsPath string, b Bandwidth) error {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return fmt.Errorf("sandbox bandwidth: open network namespace: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("sandbox bandwidth: %w", err)
	}
	defer h.Close()
	links, err := h.LinkList()
	if err != nil {
		return fmt.Errorf("sandbox bandwidth: list interfaces: %w", err)
	}
	// The node's ends of veths are in the agent's own namespace.
	host, err := netlink.NewHandle()
	if err != nil {
		return fmt.Errorf("sandbox bandwidth: %w", err)
	}
	defer host.Close()
	var errs []error
	for _, l := range links {
		if l.Attrs().Flags&net.FlagLoopback != 0 {
			continue
		}
		if err := tbf(h, l, b.Egress); err != nil {
			errs = append(errs, fmt.Errorf("egress of %s: %w", l.Attrs().Name, err))
		}
		veth, ok := l.(*netlink.Veth)
		if !ok {
			if b.Ingress > 0 {
				errs = append(errs, fmt.Errorf("ingress of %s: only a veth's ingress can be capped, and this is a %s", l.Attrs().Name, l.Type()))
			}
			continue
		}
		// A veth's link attribute is its peer's index, in the peer's
		// namespace (here: the node's).
		peer := veth.Attrs().ParentIndex
		node, err := host.LinkByIndex(peer)
		if err != nil {
			errs = append(errs, fmt.Errorf("ingress of %s: its node end (index %d): %w", l.Attrs().Name, peer, err))
			continue
		}
		if err := tbf(host, node, b.Ingress); err != nil {
			errs = append(errs, fmt.Errorf("ingress of %s (on %s): %w", l.Attrs().Name, node.Attrs().Name, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("sandbox bandwidth: %w", err)
	}
	return nil
}

// tbf sets (or, for 0, removes) a token-bucket root queue on l.
func tbf(h *netlink.Handle, l netlink.Link, bits int64) error {
	root := netlink.QdiscAttrs{LinkIndex: l.Attrs().Index, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT}
	if bits <= 0 {
		if err := h.QdiscDel(&netlink.Tbf{QdiscAttrs: root}); err != nil && !notThere(err) {
			return fmt.Errorf("remove the cap: %w", err)
		}
		return nil
	}
	rate := uint64(bits / 8)
	burst := burstBytes(rate)
	// As tc's tbf: the bucket in ticks, the queue as long as the latency
	// allows at the rate, plus the bucket.
	buffer := uint32(float64(netlink.TIME_UNITS_PER_SEC) * float64(burst) / float64(rate) * netlink.TickInUsec())
	limit := uint32(float64(rate)*tbfLatencyMicros/netlink.TIME_UNITS_PER_SEC) + burst
	if err := h.QdiscReplace(&netlink.Tbf{QdiscAttrs: root, Rate: rate, Buffer: buffer, Limit: limit}); err != nil {
		return fmt.Errorf("cap at %d bit/s: %w", bits, err)
	}
	return nil
}

// burstBytes is the bucket: 10 ms at the rate, at least 64 KiB.
func burstBytes(rate uint64) uint32 {
	return uint32(max(rate/100, 64<<10))
}

func notThere(err error) bool {
	return errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINVAL) || errors.Is(err, os.ErrNotExist)
}

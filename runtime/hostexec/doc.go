// Package hostexec runs the worker's own programs — its CNI plugins and its
// iptables — from a node agent that lives in a container.
//
// The node agent's image is minimal: it carries no CNI plugins and no
// iptables, and a worker's plugins are usually dynamically linked against the
// host's libraries and configured for the host's iptables backend. So when
// sandman-node runs as a DaemonSet pod (host network, the host's root mounted
// read-only at HostRoot), Setup makes a directory of shims: symlinks named
// like each plugin and tool that point at the agent's own executable. go-cni
// and go-iptables exec a shim; Main, called first in the agent's main,
// recognises the name, opens the network namespace the plugin must enter
// (CNI_NETNS) so it stays reachable as /proc/self/fd/N, chroots into the host
// root and execs the real program there, with CNI_PATH pointing at the host's
// plugin directory. The program then runs exactly as the kubelet's pods' CNI
// calls do: the worker's plugins, the worker's iptables, the worker's IPAM
// state.
package hostexec

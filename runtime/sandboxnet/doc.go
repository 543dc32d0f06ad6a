// Package sandboxnet is the firewall of a sandbox's network namespace: what
// code in the sandbox may reach, and what may reach it.
//
// The rules live in the slot's own network namespace (an nftables table,
// written over netlink by the node agent), not on the host: sandbox code has
// no CAP_NET_ADMIN, so it cannot change them, they need no host iptables and
// no help from the cluster's CNI (which does not see slot interfaces), and
// they go with the namespace when the slot goes. A whole policy is replaced
// in one netlink batch, so a sandbox never sees half of one.
//
// Egress, in order: the loopback and replies to connections made to the
// sandbox pass; PodDeny (the pod's own denied ranges; 0.0.0.0/0 for a pod
// that wants no egress) is rejected; the pod's NetworkPolicy rules
// (EgressTo), when policies select it, must match; Allow (the pool's
// exceptions: a proxy, DNS) passes; Deny (private, link-local and special
// ranges, the node's own addresses, the cluster's ranges) is rejected;
// then, if the pool allows no internet, everything else is rejected; else,
// if the pod narrowed its egress (Only, or names: a Resolver), only those
// prefixes and the addresses the node's resolver answered its names with
// (Pin, each for its TTL) pass; such a pod's DNS, to any address, is
// redirected to that resolver, the one node address it reaches. IPv6 is rejected but for the loopback. Ingress:
// the loopback, replies, ICMP and the listed TCP and UDP ports pass;
// everything else is rejected.
package sandboxnet

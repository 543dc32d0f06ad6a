// Package sandboxdns is the node's DNS resolver for sandboxes whose pods
// allow egress by name (sandman.io/egress-domains): the one place such a
// sandbox's names are resolved, so it cannot be lied to, and the place
// that opens the sandbox's firewall to what the names resolve to.
//
// One Server runs in the node agent, on UDP and TCP. The agent registers
// each such sandbox by its address (Register) with its allowed names and
// a Pinner that adds addresses to the sandbox's firewall; the sandbox's
// DNS traffic, to whatever server its resolv.conf names, is redirected to
// the Server in the sandbox's own network namespace (runtime/sandboxnet).
// A query from an address nobody registered, or for a name the sandbox
// may not resolve, is answered REFUSED. An allowed A query is forwarded
// to the upstream servers, and the addresses its answer holds, following
// CNAMEs from the name asked, are pinned for their TTL (clamped) before
// the answer goes back: by the time the sandbox connects, its firewall
// lets it. As a name re-resolves, its new addresses are pinned and the
// old ones lapse. AAAA (sandboxes have no IPv6) and HTTPS/SVCB (whose
// address hints would never be pinned) are answered with no records;
// other types of allowed names are forwarded as they are.
package sandboxdns

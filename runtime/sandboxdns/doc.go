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
//
// Each sandbox has budgets of its own (budget.go), under the node's
// ceilings of queries in flight and TCP connections, so that one sandbox
// costs the others nothing: its queries being answered at once and its
// TCP connections open are bounded, and so is its query rate (a token
// bucket); past them its queries are refused (an Extended DNS Error says
// why) and its connections closed, before they take any of the node's.
// One answer pins at most Config.MaxAnswerAddrs addresses, and the sandbox
// is answered only those: it is never given an address it cannot reach.
// A sandbox has at most Config.MaxPinnedAddrs addresses pinned at once (the
// Server counts them, with when they lapse): an answer that would pin more
// is refused until older ones lapse, which bounds its firewall set.
package sandboxdns

// Package gateway is sandman's E2B-compatible front door: trainers written
// against E2B's SDK set E2B_API_URL and E2B_SANDBOX_URL to it and run
// unchanged.
//
// It serves two things, on one listener or two:
//
//   - E2B's control API (create, get, list, kill, timeout, refresh, connect),
//     authenticated by X-API-Key against hashed keys from a Secret. A sandbox
//     is an ordinary pod on the key's pool, in the key's namespace, named by
//     its sandbox ID; its lifetime is the sandman.io/expires-at annotation,
//     which the virtual node enforces. Templates resolve to images through a
//     ConfigMap. Everything E2B has and sandman has not (pause, snapshots,
//     template builds, volumes, …) answers 501 with a message.
//   - The single-endpoint sandbox proxy: requests carrying E2b-Sandbox-Id and
//     E2b-Sandbox-Port go to that pod's daemon (port 49983), streamed, over
//     HTTP/1.1 or cleartext HTTP/2, and only to the pod the request's access
//     token opens: the gateway's own sandbox of that ID, in a key's
//     namespace, whose token it is (see Gateway.tokenCheck). The daemon
//     checks the token again.
//
// The gateway keeps no state of its own: every replica reads the same pods,
// Secret and ConfigMap, and derives the same per-sandbox access tokens from
// a shared token key (see Tokens), so any replica answers any call.
package gateway

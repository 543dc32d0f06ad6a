// Package gateway is sandman's E2B-compatible front door: trainers written
// against E2B's SDK set E2B_API_URL and E2B_SANDBOX_URL to it and run
// unchanged.
//
// It serves two things, on one listener or two:
//
//   - E2B's control API: sandboxes (create, get, list, kill, timeout,
//     refresh, connect, pause, resume, fork, network, logs, metrics),
//     snapshots, templates and their builds, authenticated by X-API-Key
//     against hashed keys from a Secret. A sandbox is an ordinary pod on the
//     key's pool, in the key's namespace, named by its sandbox ID; its
//     lifetime is the sandman.io/expires-at annotation, which the virtual
//     node enforces. What E2B has and sandman has not (volumes, secrets,
//     teams, …) answers 501 with a message.
//   - Sandbox traffic: requests carrying E2b-Sandbox-Id (or for a host
//     <port>-<sandboxID>.<domain>) go to that pod's daemon (port 49983) or
//     to one of its ports, streamed, over HTTP/1.1 or cleartext HTTP/2, and
//     only to a pod the gateway proves it made, whose token the request
//     carries (the daemon checks the token again).
//
// Every route is declared in one table (routes.go) with its authorization
// class and per-tenant budget; one authorization point (authz.go) resolves
// each request to a verified tenant and sandbox, or refuses it, before any
// handler runs. A pod counts as a sandbox only when its token hash
// recovers from the token keys for its own namespace and ID
// (Gateway.proven).
//
// Replicas keep no sandbox state: every replica reads the same pods,
// Secret and ConfigMap, and derives the same per-sandbox access tokens from
// a shared token key (see Tokens), so any replica answers any sandbox
// call. A template build runs on the replica that started it, its status
// and logs in a ConfigMap every replica reads; the files of its COPY steps
// are in a registry every replica reads (Config.UploadRepository), or else
// on the disk of the replica that received them (uploadstore.go).
package gateway

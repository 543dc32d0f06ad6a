// Package nodeapi is the node agent's API: HTTP/1.1 + JSON with a bearer
// token (the pool secret). Server serves a runtime.Runtime; Client is a
// runtime.Runtime that calls one over the network, so the virtual node
// drives remote slots through the same contract (and the same conformance
// suite) as local ones.
//
//	GET  /healthz                 no token; "ok"
//	GET  /v1/inventory            runtime.Inventory
//	GET  /v1/watch                NDJSON: {"inventory":…}, then {"event":…} per change, {"heartbeat":…} every 10 s
//	POST /v1/bind                 runtime.BindRequest → runtime.Slot
//	POST /v1/release              {"uid":…, "grace_seconds":…}
//	GET  /v1/stats?uid=           runtime.Stats
//
// Errors are {"error":{"code":…,"message":…}} with the errdefs class as code.
package nodeapi

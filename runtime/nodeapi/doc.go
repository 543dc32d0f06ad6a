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
//	POST /v1/leader               the caller leads (its epoch) → {"epoch":…}
//	POST /v1/snapshot             runtime.SnapshotRequest → NDJSON: {"progress":…} per step, then {"result":…} or {"error":…}
//	POST /v1/pause                {"uid":…} → runtime.PauseResult (runtime.Checkpointer)
//	POST /v1/resume               {"uid":…}
//	POST /v1/egress               {"uid":…, "egress":[…], "egress_deny":[…], "egress_domains":[…]} (runtime.EgressSetter)
//
// Fencing: an elected sandman-vk sends its leader epoch (HeaderLeaderEpoch)
// with every call. Every POST (bind, release, drain, undrain, image pins,
// leader, snapshot, pause, resume, egress) is refused with 409 stale_leader ("stale leader: epoch N < M")
// when its epoch is lower than the highest the agent has seen, or carries
// none once the agent has seen one; otherwise its epoch becomes the highest.
// The highest is kept in memory only: a restarted agent takes the first
// epoch it is sent.
//
// Errors are {"error":{"code":…,"message":…}} with the errdefs class as code
// (a snapshot's, once its stream has begun, are its last line). Client is
// also a runtime.Snapshotter, a runtime.Checkpointer and a
// runtime.EgressSetter.
package nodeapi

// Package podcontract names the pod contract: every label, annotation,
// condition type, condition reason and event reason that crosses sandman's
// components — written by a trainer, sandmanctl or sandman-gateway, read by
// the virtual node (vk), the pool and the node agent's NetworkPolicy engine,
// or written by the virtual node for a trainer or operator to read.
//
// The rule: a name that crosses components is defined here, once, and every
// component (vk, pool, gateway, runtime/netpolicy, cmd/sandmanctl, vk/client,
// the e2e tests and hack/bench) uses this constant rather than a copy or a
// literal. The package imports nothing but the standard library (a test
// keeps it so), so a trainer's code may import it without Kubernetes or
// sandman's servers.
//
// What it holds:
//   - labels.go: the pool label and taint key, the job and run labels, the
//     gateway's sandbox and key labels, the namespace access label prefix;
//   - annotations.go: the sandbox's token hash, expiry, idle timeout,
//     egress narrowing and bandwidth, the snapshots the virtual node
//     recorded, the virtual node's capacity annotations, the gateway's E2B
//     annotations;
//   - reasons.go: the reasons the virtual node gives a pod's status and
//     events, and its node's condition types and their reasons.
//
// Not here: the reasons a node agent reports for a slot (runtime.Reason*:
// InvalidSpec, ErrImagePull, ImageNotFound, Evicted, OOMKilled, ...) are the
// node API's and stay in package runtime; the virtual node passes them
// through as the pod's and its container's reason unchanged. The labels the
// node agent puts on containerd objects are the node agent's own.
package podcontract

// Package vk is the virtual-kubelet provider: it translates pods scheduled onto
// a virtual node into pool placements and node-agent binds, turns slot events
// back into pod status, and reports pool capacity as the node's status.
package vk

// Package runtimetest is the conformance suite of the runtime.Runtime
// contract. runtime/noderuntime (root tier, real containerd) and runtime/fake
// both run it: Suite(t, newHarness).
package runtimetest

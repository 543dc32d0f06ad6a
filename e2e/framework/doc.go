// Package framework gives the root, e2e and soak tiers, and hack/bench, the
// real local stack. Main (a package's TestMain) reuses a stack that is up —
// by hack/lib.sh's stack_up, the one rule every tier uses (StackUp runs it)
// — or starts one for the test binary and stops it again; Get hands a test
// the Stack, Load a program that is not a test. A Stack holds a client-go
// clientset, the containerd address (NewContainerd, Containerd) and the
// registry and image names from stack.env.
package framework

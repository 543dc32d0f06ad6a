// Package framework gives end-to-end and root-tier tests the real local stack:
// it reuses a running stack (hack/local-up.sh) or starts one for the test
// binary and stops it again, and hands tests a client-go clientset, a
// containerd client and the registry address.
package framework

// Package e2e holds end-to-end tests against the real local stack (hack/):
// kube-apiserver, etcd, kube-scheduler, kube-controller-manager, containerd,
// runc, CNI and a registry. Its tests are built with the e2e tag.
package e2e

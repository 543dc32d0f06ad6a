// Package e2e holds the tests that need the real local stack (hack/):
// kube-apiserver, etcd, kube-scheduler, kube-controller-manager, the
// kubelet worker, containerd, runc, CNI and a registry. Three tiers share
// the package, each chosen by build tag and file name; hack/test.sh defines
// how each runs (make test-root, make e2e, make soak; make test runs root
// and e2e):
//
//   - root: *_root_test.go, tag root, tests named TestRoot* (the tier runs
//     -run '^TestRoot' over the whole module, so root tests may also live
//     beside their package, as runtime/hostexec's does). They drive the
//     stack's containerd, runc and CNI directly.
//   - e2e: *_e2e_test.go and smoke_test.go, tag e2e. They drive the whole
//     stack: the virtual node, kubectl, the node agent, the gateway.
//   - soak: soak_test.go and soak_*_test.go, tags e2e and soak together;
//     not part of make test.
//   - shared: main_test.go (TestMain: e2e/framework.Main), bins_test.go,
//     netprobe_test.go and registry_test.go, tag root || e2e, the helpers
//     both tiers use.
//
// Each tier builds alone (the e2e tier without the root files, and so on),
// so a root or e2e file can use only the shared files and its own tier's;
// the soak is built with the e2e tier and uses its helpers (startPool).
// The soak's report logic is in e2e/soakreport; the stack itself, for
// every tier and for hack/bench, in e2e/framework.
package e2e

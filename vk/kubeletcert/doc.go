// Package kubeletcert gets the virtual node's kubelet serving certificate
// from the cluster, as a kubelet with serverTLSBootstrap does: a
// certificates.k8s.io/v1 CertificateSigningRequest for the signer
// kubernetes.io/kubelet-serving (client-go's certificate manager creates it,
// waits for it and renews it before it expires), which kube-controller-manager
// signs with the cluster CA once it is approved. The apiserver verifies kubelet
// serving certificates against that CA (--kubelet-certificate-authority).
//
// Nothing in a cluster approves kubelet-serving requests by default, so the
// Manager approves its own: a request is approved only when it was made by
// this process (its public key is one the Manager generated), by the identity
// the apiserver gives sandman-vk (a SelfSubjectReview), for exactly
// CN=system:node:<node>, O=system:nodes, with only the node's IPs and name as
// subject alternative names and kubelet-serving key usages. Anything else is
// left alone, with a log line saying why.
//
// RBAC the Manager needs (cluster-scoped, CSRs are not namespaced):
//
//   - certificates.k8s.io certificatesigningrequests: create, get, list,
//     watch (make its requests, wait for them, follow them to approve)
//   - certificates.k8s.io certificatesigningrequests/approval: update
//     (approve its own requests)
//   - certificates.k8s.io signers, resourceNames kubernetes.io/kubelet-serving:
//     approve (the apiserver checks it on every approval)
//   - authentication.k8s.io selfsubjectreviews: create (learn its own
//     identity; granted to every authenticated user by system:basic-user)
package kubeletcert

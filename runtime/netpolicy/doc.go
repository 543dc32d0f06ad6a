// Package netpolicy is the node agent's NetworkPolicy engine. The cluster's
// CNI does not see sandbox slots (their interfaces are made by the agent,
// their pods live on a virtual node), so the agent enforces, on each slot's
// own firewall (runtime/sandboxnet), the Kubernetes NetworkPolicies that
// select the sandbox's pod, and who may reach a sandbox by default.
//
// It watches pods, namespaces and NetworkPolicies (client-go informers) and
// answers, for one sandbox pod, the ingress and egress rules to apply:
//
//   - Ingress with no policy selecting the pod: the pods of its own
//     namespace and of the control namespaces (sandman-vk, the gateway). With
//     policies: what their ingress rules allow (podSelector,
//     namespaceSelector, ipBlock with except, ports and port ranges), plus the
//     control namespaces on the daemons' ports, so the sandbox stays
//     manageable (kubectl exec, idle checks) whatever a policy says.
//   - Egress with no policy of type Egress: no narrowing (the pool's rules
//     apply). With policies: a connection must match one of their egress
//     rules and then pass the pool's rules: a policy narrows, never widens,
//     what the pool allows.
//
// Sandbox pods are never peers: they cannot open connections to private
// addresses (the pool's rules), so their addresses would only make rules
// longer, and their churn would rewrite every slot's firewall. Their own
// label changes do count (they change which policies select them). Named
// ports are not supported (a rule naming one matches nothing; said in the
// docs).
package netpolicy

// Package client calls the virtual node's own routes (vk/api) through the
// apiserver's node proxy, /api/v1/nodes/<node>/proxy/sandman/v1/..., with a
// client-go REST client: what trainer code and sandmanctl use to snapshot a
// sandbox. The caller needs RBAC nodes/proxy (create) on the virtual node.
// It links client-go and the wire types, not the virtual node's server.
package client

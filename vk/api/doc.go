// Package api holds the wire types of the virtual node's own HTTP routes
// (images, pre-pull, capacity), served by package vk under APIPrefix and read
// by sandmanctl through the apiserver's node proxy. It depends only on the
// standard library and sandman's runtime types, so a client links none of
// the provider, the pool or virtual-kubelet. JSON field names are the wire
// contract: change them only with a new APIPrefix.
package api

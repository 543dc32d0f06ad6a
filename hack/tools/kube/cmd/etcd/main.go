// Command etcd is etcd's server, built from the version that the pinned
// Kubernetes module requires.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }

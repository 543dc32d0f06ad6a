// Command registry is the distribution registry with the parts the local
// stack uses: `registry serve CONFIG` and `registry garbage-collect CONFIG`
// from the upstream command tree, storage on the filesystem (or in memory),
// and htpasswd, token or silly auth (the e2e tests start an htpasswd one). A
// config naming another storage driver fails at start with the driver's name.
package main

import (
	"os"

	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/auth/htpasswd"
	_ "github.com/distribution/distribution/v3/registry/auth/silly"
	_ "github.com/distribution/distribution/v3/registry/auth/token"
	_ "github.com/distribution/distribution/v3/registry/proxy"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
)

func main() {
	// Cobra prints the error and the usage itself.
	if err := registry.RootCmd.Execute(); err != nil {
		os.Exit(1)
	}
}

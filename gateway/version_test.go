package gateway

import (
	"testing"

	"github.com/sandman-dev/sandman/daemon/envd"
)

// TestEnvdVersionIsTheDaemons: the version create and connect report is
// the one the daemon speaks; the SDK turns features on by it.
func TestEnvdVersionIsTheDaemons(t *testing.T) {
	if EnvdVersion != envd.Version {
		t.Fatalf("the gateway reports envd %s, the daemon speaks %s", EnvdVersion, envd.Version)
	}
}

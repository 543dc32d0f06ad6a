//go:build root

package daemon_test

import (
	"testing"

	"github.com/sandman-dev/sandman/daemon/internal/gvisortest"
)

// TestRootFilesGVisor runs the daemon's file calls — v1 and envd, as the
// daemon's own user and as another (uid and groups, the kernel checking
// each) — and its commands as another user inside a gVisor sandbox, as
// the unit tier runs them on Linux's kernel.
func TestRootFilesGVisor(t *testing.T) {
	tests := []string{
		"TestFilesRoundTrip", "TestFilesErrors", "TestFilesListStatMoveRemove", "TestFilesTar", "TestFilesUploadLimit",
		"TestEnvdFilesystemStat", "TestEnvdFilesystemMakeDir", "TestEnvdFilesystemListDir", "TestEnvdFilesystemMove",
		"TestEnvdFilesystemRemove", "TestEnvdFilesystemUsers", "TestEnvdWatchDir", "TestEnvdPollingWatcher",
		"TestEnvdFileMetadata", "TestEnvdFileMetadataRefused", "TestEnvdRESTFilesRoundTrip", "TestEnvdRESTUploadWatched",
		"TestEnvdRESTFilesErrors", "TestEnvdRESTFilesOwner",
		"TestEnvdFilesAsUser", "TestEnvdFilesAsUserConcurrent", "TestEnvdFilesAsUserNewParents",
		"TestEnvdUser", "TestEnvdDefaultUser",
	}
	gvisortest.Rerun(t, tests...)
}

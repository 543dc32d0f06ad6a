package noderuntime

import (
	"testing"

	"github.com/containerd/errdefs"
)

// TestCheckMovedRef: a node restores a moved sandbox only from its own
// checkpoint repository, under the pod's namespace, by digest; a node
// without a repository restores none.
func TestCheckMovedRef(t *testing.T) {
	const dgst = "@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	r := &Runtime{cfg: Config{Node: "w1", CheckpointRepository: "reg:5000/ckpt"}}
	if err := r.checkMovedRef("reg:5000/ckpt/team-a/p"+dgst, "team-a"); err != nil {
		t.Fatalf("its own namespace's checkpoint refused: %v", err)
	}
	if err := r.checkMovedRef("reg:5000/ckpt/team-b/p"+dgst, ""); err != nil {
		t.Fatalf("a delete (any namespace) refused: %v", err)
	}
	for _, ref := range []string{
		"reg:5000/ckpt/team-b/p" + dgst,      // another namespace's
		"reg:5000/ckpt-x/team-a/p" + dgst,    // beside the repository
		"other:5000/ckpt/team-a/p" + dgst,    // another registry
		"reg:5000/ckpt/team-a/p:moved-u1",    // not by digest
		"reg:5000/ckpt/team-a/../b/p" + dgst, // not a reference
	} {
		if err := r.checkMovedRef(ref, "team-a"); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: err = %v, want InvalidArgument", ref, err)
		}
	}
	none := &Runtime{cfg: Config{Node: "w1"}}
	if err := none.checkMovedRef("reg:5000/ckpt/team-a/p"+dgst, "team-a"); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("a node without a repository: err = %v, want FailedPrecondition", err)
	}
}

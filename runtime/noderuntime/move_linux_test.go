package noderuntime

import (
	"testing"

	"github.com/containerd/errdefs"

	"github.com/sandman-dev/sandman/runtime"
)

// TestCheckMovedRef: a node restores or deletes a moved sandbox only from
// its own checkpoint repository, under the pod's namespace and name, by
// digest; a node without a repository restores none.
func TestCheckMovedRef(t *testing.T) {
	const dgst = "@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	r := &Runtime{cfg: Config{Node: "w1", CheckpointRepository: "reg:5000/ckpt"}}
	pod := runtime.PodRef{UID: "u1", Namespace: "team-a", Name: "p"}
	if err := r.checkMovedRef("reg:5000/ckpt/team-a/p"+dgst, pod); err != nil {
		t.Fatalf("its own checkpoint refused: %v", err)
	}
	for _, ref := range []string{
		"reg:5000/ckpt/team-b/p" + dgst,      // another namespace's
		"reg:5000/ckpt/team-a/q" + dgst,      // another pod's
		"reg:5000/ckpt/x/team-a/p" + dgst,    // deeper in the repository
		"reg:5000/ckpt-x/team-a/p" + dgst,    // beside the repository
		"other:5000/ckpt/team-a/p" + dgst,    // another registry
		"reg:5000/ckpt/team-a/p:moved-u1",    // not by digest
		"reg:5000/ckpt/team-a/../b/p" + dgst, // not a reference
	} {
		if err := r.checkMovedRef(ref, pod); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: err = %v, want InvalidArgument", ref, err)
		}
	}
	if err := r.checkMovedRef("reg:5000/ckpt/team-a/p"+dgst, runtime.PodRef{UID: "u1"}); !errdefs.IsInvalidArgument(err) {
		t.Errorf("no pod namespace and name: err = %v, want InvalidArgument", err)
	}
	none := &Runtime{cfg: Config{Node: "w1"}}
	if err := none.checkMovedRef("reg:5000/ckpt/team-a/p"+dgst, pod); !errdefs.IsFailedPrecondition(err) {
		t.Errorf("a node without a repository: err = %v, want FailedPrecondition", err)
	}
}

// TestMovedConfigOf: an artifact's config is the pod's only with its UID,
// namespace and name (a pod of the same name before it has another UID).
func TestMovedConfigOf(t *testing.T) {
	pod := runtime.PodRef{UID: "u1", Namespace: "team-a", Name: "p"}
	if err := (movedConfig{PodUID: "u1", Namespace: "team-a", Name: "p"}).of(pod); err != nil {
		t.Fatalf("its own config refused: %v", err)
	}
	for name, c := range map[string]movedConfig{
		"another UID":       {PodUID: "u0", Namespace: "team-a", Name: "p"},
		"another namespace": {PodUID: "u1", Namespace: "team-b", Name: "p"},
		"another name":      {PodUID: "u1", Namespace: "team-a", Name: "q"},
	} {
		if err := c.of(pod); !errdefs.IsInvalidArgument(err) {
			t.Errorf("%s: err = %v, want InvalidArgument", name, err)
		}
	}
}

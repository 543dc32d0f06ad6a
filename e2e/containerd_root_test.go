//go:build root

package e2e

import (
	"bytes"
	"context"
	"strings"
	"testing"

	containerd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"k8s.io/apimachinery/pkg/util/rand"

	"github.com/sandman-dev/sandman/e2e/framework"
)

// TestRootContainerdRunsBusybox pulls the busybox test image from the local
// registry into the stack's containerd and runs a container whose output the
// test reads back, then removes the container, its task and its snapshot.
func TestRootContainerdRunsBusybox(t *testing.T) {
	s := framework.Get(t)
	client := s.Containerd(t, "sandman-test")
	ctx := t.Context()

	resolver := docker.NewResolver(docker.ResolverOptions{
		Hosts: docker.ConfigureDefaultRegistries(docker.WithPlainHTTP(docker.MatchLocalhost)),
	})
	img, err := client.Pull(ctx, s.BusyboxImage, containerd.WithPullUnpack, containerd.WithResolver(resolver))
	if err != nil {
		t.Fatalf("pull %s: %v", s.BusyboxImage, err)
	}

	id := "root-smoke-" + rand.String(6)
	container, err := client.NewContainer(ctx, id,
		containerd.WithNewSnapshot(id, img),
		containerd.WithNewSpec(oci.WithImageConfig(img), oci.WithHostname("smoke"),
			oci.WithProcessArgs("sh", "-c", `echo "hello from $(hostname)"; echo oops >&2; exit 3`)),
	)
	if err != nil {
		t.Fatalf("create container: %v", err)
	}
	t.Cleanup(func() {
		if err := container.Delete(context.WithoutCancel(ctx), containerd.WithSnapshotCleanup); err != nil {
			t.Errorf("delete container: %v", err)
		}
	})

	var stdout, stderr bytes.Buffer
	task, err := container.NewTask(ctx, cio.NewCreator(cio.WithStreams(nil, &stdout, &stderr)))
	if err != nil {
		t.Fatalf("create task: %v", err)
	}
	exitCh, err := task.Wait(ctx)
	if err != nil {
		t.Fatalf("wait task: %v", err)
	}
	if err := task.Start(ctx); err != nil {
		t.Fatalf("start task: %v", err)
	}
	status := <-exitCh
	code, _, err := status.Result()
	if err != nil {
		t.Fatalf("task result: %v", err)
	}
	if _, err := task.Delete(ctx); err != nil {
		t.Fatalf("delete task: %v", err)
	}
	if code != 3 {
		t.Errorf("exit code = %d, want 3", code)
	}
	if got := strings.TrimSpace(stdout.String()); got != "hello from smoke" {
		t.Errorf("stdout = %q, want %q", got, "hello from smoke")
	}
	if got := strings.TrimSpace(stderr.String()); got != "oops" {
		t.Errorf("stderr = %q, want %q", got, "oops")
	}
}

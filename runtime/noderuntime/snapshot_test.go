package noderuntime

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/containerd/errdefs"
	digest "github.com/opencontainers/go-digest"
)

func TestSnapshotImageName(t *testing.T) {
	for _, tc := range []struct {
		registry, ref, want string
		class               func(error) bool
	}{
		{"registry.local:5000", "myenv:v1", "registry.local:5000/myenv:v1", nil},
		{"registry.local:5000", "team/myenv", "registry.local:5000/team/myenv:latest", nil},
		{"registry.local:5000", "registry.local:5000/team/myenv:v2", "registry.local:5000/team/myenv:v2", nil},
		{"registry.local:5000/snaps", "myenv:v1", "registry.local:5000/snaps/myenv:v1", nil},
		{"registry.local:5000/snaps", "registry.local:5000/snaps/a/b:v1", "registry.local:5000/snaps/a/b:v1", nil},
		{"localhost:5000", "localhost:5000/x:y", "localhost:5000/x:y", nil},
		{"registry.local:5000/snaps", "registry.local:5000/other/myenv:v1", "", errdefs.IsInvalidArgument},
		{"registry.local:5000/snaps", "registry.local:5000/snapsx/myenv:v1", "", errdefs.IsInvalidArgument},
		{"registry.local:5000", "docker.io/library/debian:12", "", errdefs.IsInvalidArgument},
		{"registry.local:5000", "registry.local:5001/myenv:v1", "", errdefs.IsInvalidArgument},
		{"registry.local:5000", "myenv@sha256:" + strings.Repeat("a", 64), "", errdefs.IsInvalidArgument},
		{"registry.local:5000", "My Env", "", errdefs.IsInvalidArgument},
		{"registry.local:5000", "", "", errdefs.IsInvalidArgument},
		{"", "myenv:v1", "", errdefs.IsFailedPrecondition},
	} {
		t.Run(tc.registry+" "+tc.ref, func(t *testing.T) {
			got, err := snapshotImageName(tc.registry, tc.ref)
			if tc.class != nil {
				if !tc.class(err) {
					t.Fatalf("got %q, %v: want an error of another class", got, err)
				}
				if tc.registry != "" && !strings.Contains(err.Error(), tc.registry) {
					t.Errorf("the error does not name the snapshot registry: %v", err)
				}
				if tc.registry == "" && !strings.Contains(err.Error(), "--snapshot-registry") {
					t.Errorf("the error does not say what to set: %v", err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

func TestCheckSnapshotRegistry(t *testing.T) {
	for reg, ok := range map[string]bool{
		"registry.local:5000": true, "registry.local": true, "127.0.0.1:5000/sandman/snaps": true, "localhost:5000": true,
		"myregistry": false, "registry.local/": false, "Registry.local:5000/UPPER": false, "https://registry.local": false,
	} {
		if err := checkSnapshotRegistry(reg); (err == nil) != ok {
			t.Errorf("%q: %v, want ok=%v", reg, err, ok)
		}
	}
}

func TestExcludedFromSnapshot(t *testing.T) {
	for p, want := range map[string]bool{
		"/.sandman": true, "/.sandman/sandman-daemon": true, "/.sandman/state": true, "/.sandman/state/x": true,
		"/": false, "/.sandmanx": false, "/root/.sandman": false, "/etc/passwd": false, "/tmp": false,
	} {
		if got := excludedFromSnapshot(p); got != want {
			t.Errorf("%s: %v, want %v", p, got, want)
		}
	}
}

// capV3 is a security.capability value of version 3 with root uid root.
func capV3(root uint32) string {
	b := make([]byte, vfsCapV3Size)
	binary.LittleEndian.PutUint32(b, vfsCapRevision3|1) // effective
	binary.LittleEndian.PutUint32(b[4:], 1<<13)         // CAP_NET_RAW permitted
	binary.LittleEndian.PutUint32(b[vfsCapV2Size:], root)
	return string(b)
}

func TestUnmapLayer(t *testing.T) {
	const base = 1 << 31
	type file struct {
		name     string
		uid, gid int
		caps     string
	}
	in := []file{
		{"root-owned", base, base, ""},
		{"user-1000", base + 1000, base + 1000, ""},
		{"last-id", base + 65535, base + 65535, ""},
		{"outside", 65534, 12, ""},
		{"above", base + 65536, base + 65536, ""},
		{"ping", base, base, capV3(base)},
		{"nested", base, base, capV3(base + 1000)},
	}
	var src bytes.Buffer
	tw := tar.NewWriter(&src)
	for _, f := range in {
		hdr := &tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.name)), Uid: f.uid, Gid: f.gid, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if f.caps != "" {
			hdr.PAXRecords = map[string]string{paxXattrCapability: f.caps}
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		_, _ = tw.Write([]byte(f.name))
	}
	_ = tw.Close()
	var out bytes.Buffer
	if err := unmapLayer(&out, &src, base); err != nil {
		t.Fatal(err)
	}
	want := map[string][2]int{"root-owned": {0, 0}, "user-1000": {1000, 1000}, "last-id": {65535, 65535},
		"outside": {65534, 12}, "above": {base + 65536, base + 65536}, "ping": {0, 0}, "nested": {0, 0}}
	tr := tar.NewReader(&out)
	n := 0
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		n++
		if got := [2]int{hdr.Uid, hdr.Gid}; got != want[hdr.Name] {
			t.Errorf("%s: owner %v, want %v", hdr.Name, got, want[hdr.Name])
		}
		body, _ := io.ReadAll(tr)
		if string(body) != hdr.Name {
			t.Errorf("%s: content %q", hdr.Name, body)
		}
		caps := []byte(hdr.PAXRecords[paxXattrCapability])
		switch hdr.Name {
		case "ping":
			if len(caps) != vfsCapV2Size || binary.LittleEndian.Uint32(caps) != vfsCapRevision2|1 || binary.LittleEndian.Uint32(caps[4:]) != 1<<13 {
				t.Errorf("ping: capability %x, want version 2 with CAP_NET_RAW", caps)
			}
		case "nested":
			if len(caps) != vfsCapV3Size || binary.LittleEndian.Uint32(caps[vfsCapV2Size:]) != 1000 {
				t.Errorf("nested: capability %x, want version 3 with root 1000", caps)
			}
		}
	}
	if n != len(in) {
		t.Fatalf("%d entries, want %d", n, len(in))
	}
}

func TestSnapshotConfig(t *testing.T) {
	base := `{"architecture":"amd64","os":"linux","config":{"Env":["PATH=/bin"],"Healthcheck":{"Test":["CMD","true"]}},
	"container_config":{"Hostname":"x"},"rootfs":{"type":"layers","diff_ids":["sha256:` + strings.Repeat("1", 64) + `"]},
	"history":[{"created_by":"base"}]}`
	diffID := digest.Digest("sha256:" + strings.Repeat("2", 64))
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	b, err := snapshotConfig([]byte(base), diffID, 1, "sandman snapshot of ns/pod container main", now)
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Config          map[string]json.RawMessage `json:"config"`
		ContainerConfig map[string]any             `json:"container_config"`
		Created         time.Time                  `json:"created"`
		RootFS          struct {
			DiffIDs []string `json:"diff_ids"`
		} `json:"rootfs"`
		History []struct {
			CreatedBy string `json:"created_by"`
		} `json:"history"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.RootFS.DiffIDs) != 2 || got.RootFS.DiffIDs[1] != diffID.String() {
		t.Errorf("diff IDs %v", got.RootFS.DiffIDs)
	}
	if len(got.History) != 2 || got.History[1].CreatedBy != "sandman snapshot of ns/pod container main" {
		t.Errorf("history %+v", got.History)
	}
	if got.Config["Healthcheck"] == nil || got.ContainerConfig["Hostname"] != "x" || !got.Created.Equal(now) {
		t.Errorf("fields of the base config lost: %s", b)
	}
	if _, err := snapshotConfig([]byte(base), diffID, 2, "x", now); err == nil {
		t.Error("a config whose diff IDs do not match the manifest's layers was taken")
	}
}

package nodeimage

import (
	"math"
	"strings"
	"testing"

	"github.com/opencontainers/go-digest"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// TestConversionRef: a conversion is named by the source's registry and
// path under the convert repository, keyed by the source's digest, and is a
// valid reference even for a registry with a port.
func TestConversionRef(t *testing.T) {
	m := &Manager{cfg: Config{ConvertRepository: "registry.pool:5000/sandman/lazy"}}
	d := digest.FromString("manifest")
	for src, want := range map[string]string{
		"docker.io/library/python:3.12":             "registry.pool:5000/sandman/lazy/docker.io/library/python:sha256-" + d.Encoded() + "-esgz",
		"127.0.0.1:15000/swe/task-42@" + d.String(): "registry.pool:5000/sandman/lazy/127.0.0.1-15000/swe/task-42:sha256-" + d.Encoded() + "-esgz",
	} {
		got, err := m.conversionRef(src, d)
		if err != nil || got != want {
			t.Errorf("conversionRef(%s) = %q, %v; want %q", src, got, err, want)
		}
	}
}

// TestMergeHistograms: the snapshotter's per-layer latency histograms (in
// milliseconds) add up into one in seconds, for the operation asked only.
func TestMergeHistograms(t *testing.T) {
	const text = `# TYPE stargz_fs_operation_duration_milliseconds histogram
stargz_fs_operation_duration_milliseconds_bucket{layer="sha256:a",operation_type="remote_registry_get",le="10"} 1
stargz_fs_operation_duration_milliseconds_bucket{layer="sha256:a",operation_type="remote_registry_get",le="100"} 3
stargz_fs_operation_duration_milliseconds_bucket{layer="sha256:a",operation_type="remote_registry_get",le="+Inf"} 3
stargz_fs_operation_duration_milliseconds_sum{layer="sha256:a",operation_type="remote_registry_get"} 150
stargz_fs_operation_duration_milliseconds_count{layer="sha256:a",operation_type="remote_registry_get"} 3
stargz_fs_operation_duration_milliseconds_bucket{layer="sha256:b",operation_type="remote_registry_get",le="10"} 2
stargz_fs_operation_duration_milliseconds_bucket{layer="sha256:b",operation_type="remote_registry_get",le="100"} 2
stargz_fs_operation_duration_milliseconds_bucket{layer="sha256:b",operation_type="remote_registry_get",le="+Inf"} 4
stargz_fs_operation_duration_milliseconds_sum{layer="sha256:b",operation_type="remote_registry_get"} 1010
stargz_fs_operation_duration_milliseconds_count{layer="sha256:b",operation_type="remote_registry_get"} 4
stargz_fs_operation_duration_milliseconds_bucket{layer="sha256:b",operation_type="mount",le="10"} 5
stargz_fs_operation_duration_milliseconds_bucket{layer="sha256:b",operation_type="mount",le="+Inf"} 5
stargz_fs_operation_duration_milliseconds_sum{layer="sha256:b",operation_type="mount"} 20
stargz_fs_operation_duration_milliseconds_count{layer="sha256:b",operation_type="mount"} 5
`
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	count, sum, buckets := mergeHistograms(families[stargzLatency], stargzRegistryGet)
	if count != 7 || math.Abs(sum-1.16) > 1e-9 || buckets[0.01] != 3 || buckets[0.1] != 5 || len(buckets) != 2 {
		t.Errorf("merged: count %d sum %v buckets %v; want 7, 1.16, {0.01: 3, 0.1: 5}", count, sum, buckets)
	}
}

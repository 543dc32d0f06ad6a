package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestVersionOf(t *testing.T) {
	vcs := func(kv ...string) []debug.BuildSetting {
		var s []debug.BuildSetting
		for i := 0; i < len(kv); i += 2 {
			s = append(s, debug.BuildSetting{Key: kv[i], Value: kv[i+1]})
		}
		return s
	}
	const rev = "0123456789abcdef0123456789abcdef01234567"
	for _, tc := range []struct {
		name    string
		bi      *debug.BuildInfo
		stamped string
		want    string
	}{
		{"no build info", nil, "", "(devel)"},
		{"no build info, stamped", nil, "v1.2.3", "v1.2.3"},
		{"module version", &debug.BuildInfo{Main: debug.Module{Version: "v1.2.3"}}, "", "v1.2.3"},
		{"empty module version", &debug.BuildInfo{}, "", "(devel)"},
		{"devel with vcs", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
			Settings: vcs("vcs", "git", "vcs.revision", rev, "vcs.time", "2026-07-01T10:00:00Z", "vcs.modified", "false")},
			"", "(devel) (0123456789ab, 2026-07-01T10:00:00Z)"},
		{"modified", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
			Settings: vcs("vcs.revision", rev, "vcs.time", "2026-07-01T10:00:00Z", "vcs.modified", "true")},
			"", "(devel) (0123456789ab, modified, 2026-07-01T10:00:00Z)"},
		{"revision only", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}, Settings: vcs("vcs.revision", "abc")},
			"", "(devel) (abc)"},
		{"pseudo-version carries the revision", &debug.BuildInfo{Main: debug.Module{Version: "v0.0.0-20260701100000-0123456789ab+dirty"},
			Settings: vcs("vcs.revision", rev, "vcs.time", "2026-07-01T10:00:00Z", "vcs.modified", "true")},
			"", "v0.0.0-20260701100000-0123456789ab+dirty"},
		{"stamped wins over the module", &debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
			Settings: vcs("vcs.revision", rev, "vcs.modified", "false")},
			"v1.2.3", "v1.2.3 (0123456789ab)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := versionOf(tc.bi, tc.stamped); got != tc.want {
				t.Errorf("versionOf = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestVersion reads this test binary's own build info.
func TestVersion(t *testing.T) {
	if got := Version(""); got == "" {
		t.Error("Version(\"\") is empty")
	}
	if got := Version("v9.9.9"); !strings.HasPrefix(got, "v9.9.9") {
		t.Errorf("Version(stamped) = %q, want it to start with the stamped version", got)
	}
}

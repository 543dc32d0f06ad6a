package envd

import (
	"net/http"
	"testing"
	"time"
)

// TestKeepaliveInterval: one reading of the header for every stream.
func TestKeepaliveInterval(t *testing.T) {
	for _, tc := range []struct {
		header string
		want   time.Duration
	}{
		{"", defaultKeepalive},
		{"50", 50 * time.Second},
		{" 1 ", time.Second},
		{"0.05", 50 * time.Millisecond},
		{"0.000001", minKeepalive},
		{"86400", maxKeepalive},
		{"0", defaultKeepalive},
		{"-3", defaultKeepalive},
		{"NaN", defaultKeepalive},
		{"+Inf", defaultKeepalive},
		{"fifty", defaultKeepalive},
	} {
		h := http.Header{}
		if tc.header != "" {
			h.Set(keepaliveHeader, tc.header)
		}
		if got := keepaliveInterval(h); got != tc.want {
			t.Errorf("%q: %v, want %v", tc.header, got, tc.want)
		}
	}
}

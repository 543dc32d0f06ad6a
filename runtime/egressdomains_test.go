package runtime

import (
	"fmt"
	"strings"
	"testing"
)

// TestCheckEgressDomain: allowed names are lowercase RFC 1123 names or a wildcard
// of their first label; anything else is refused saying why.
func TestCheckEgressDomain(t *testing.T) {
	for _, tc := range []struct {
		name, refused string // "": accepted
	}{
		{name: "api.example.com"},
		{name: "*.example.com"},
		{name: "localhost"},
		{name: "a-b.x1.io"},
		{name: "3com.com"},
		{name: "API.example.com", refused: "lowercase"},
		{name: "api.example.com.", refused: "no trailing dot"},
		{name: "*.com", refused: "at least two"},
		{name: "*", refused: "whole first label"},
		{name: "a.*.example.com", refused: "whole first label"},
		{name: "*a.example.com", refused: "whole first label"},
		{name: "-a.example.com", refused: "hyphen"},
		{name: "a..com", refused: "1 to 63"},
		{name: strings.Repeat("a", 64) + ".com", refused: "1 to 63"},
		{name: strings.Repeat("a.", 127) + "com", refused: "253"},
		{name: "203.0.113.7", refused: "an address"},
		{name: "a_b.example.com", refused: "lowercase letters"},
		{name: "", refused: "1 to 63"},
	} {
		err := CheckEgressDomain(tc.name)
		if tc.refused == "" && err != nil {
			t.Errorf("%q: %v", tc.name, err)
		}
		if tc.refused != "" && (err == nil || !strings.Contains(err.Error(), tc.refused)) {
			t.Errorf("%q: %v, want an error saying %q", tc.name, err, tc.refused)
		}
	}
	many := make([]string, MaxEgressDomains+1)
	for i := range many {
		many[i] = fmt.Sprintf("n%d.example.com", i)
	}
	if err := CheckEgressDomains(many); err == nil {
		t.Errorf("%d names accepted, want at most %d", len(many), MaxEgressDomains)
	}
}

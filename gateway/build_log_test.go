package gateway

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A build's kept logs are bounded by what they cost stored, whatever the
// build prints: a million empty lines (RUN yes ”) or lines of control
// characters (each six bytes once escaped) keep the record within its
// budget, and what was not kept is counted and said at the end.
func TestBuildLogBudget(t *testing.T) {
	const limit = 64 << 10
	for _, tc := range []struct {
		name  string
		line  string
		lines int
	}{
		{"empty lines", "", 1_000_000},
		{"control characters", strings.Repeat("\x01", maxLineBytes), 10_000},
		{"ordinary lines", "step output", 100_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			run := &buildRun{namespace: nsA, logLimit: limit, rec: buildRecord{TemplateID: "t", BuildID: "b"}}
			for range tc.lines {
				run.log(testNow, "info", "1", tc.line)
			}
			run.logFinal(testNow, "info", "", "Build finished in 1s")
			rec := run.snapshot()
			cm, err := rec.configMap(nsA)
			if err != nil {
				t.Fatal(err)
			}
			if n := len(cm.Data[buildDataKey]); n > limit+finalLogBytes+4<<10 {
				t.Errorf("the stored record is %d bytes; the budget is %d", n, limit)
			}
			if !rec.LogsCut || rec.DroppedLines == 0 || int(rec.DroppedLines)+len(rec.Logs)-2 != tc.lines {
				t.Errorf("cut %v, dropped %d lines, kept %d of %d", rec.LogsCut, rec.DroppedLines, len(rec.Logs), tc.lines)
			}
			last := rec.Logs[len(rec.Logs)-1].Message
			if !strings.HasPrefix(last, "Build finished") || !strings.Contains(last, "were not kept") {
				t.Errorf("last line %q", last)
			}
		})
	}
}

// uploadURL asks for the upload link of hash for a template of key's.
func (b *buildEnv) uploadURL(key, templateID, hash string) string {
	b.t.Helper()
	r := b.call(http.MethodGet, "/templates/"+templateID+"/files/"+hash, key, nil)
	var fu fileUpload
	r.decode(b.t, &fu)
	if r.status != http.StatusCreated || fu.URL == nil {
		b.t.Fatalf("files link: %d %s", r.status, r.body)
	}
	return *fu.URL
}

// Uploads are charged to their tenant's upload-bytes budget as they
// arrive, and all of them to the gateway's upload disk: a tenant sending
// maximum uploads one after another is refused with 429 naming the
// budget, keeps nothing of the refused one, and another tenant's upload
// still fits.
func TestUploadBudgets(t *testing.T) {
	const max = 3 << 20
	b := newBuildEnv(t, func(c *Config) {
		c.MaxUploadBytes = max
		c.Budgets.UploadBytes = 8 << 20
		c.UploadDiskBytes = 12 << 20
	})
	resA := b.requestBuild(rawKeyA, "up")
	resB := b.requestBuild(rawKeyB, "up")
	put := func(u string) response {
		req, _ := http.NewRequest(http.MethodPut, u, bytes.NewReader(bytes.Repeat([]byte("x"), max)))
		resp, err := b.http.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return response{status: resp.StatusCode, body: body}
	}
	var codes []int
	for i := range 5 {
		r := put(b.uploadURL(rawKeyA, resA.TemplateID, fmt.Sprintf("%064x", i+1)))
		codes = append(codes, r.status)
		if r.status == http.StatusTooManyRequests && !strings.Contains(r.apiError(t).Message, `budget "upload-bytes" of namespace `+nsA) {
			t.Errorf("refusal: %s", r.body)
		}
	}
	if want := []int{200, 200, 429, 429, 429}; !slices.Equal(codes, want) {
		t.Errorf("tenant A's five maximum uploads: %v, want %v", codes, want)
	}
	if n := dirBytes(filepath.Join(b.gw.cfg.UploadDir, nsA)); n != 2*max {
		t.Errorf("tenant A holds %d bytes on disk, want the two uploads that fit, %d", n, 2*max)
	}
	for i := range 2 {
		if r := put(b.uploadURL(rawKeyB, resB.TemplateID, fmt.Sprintf("%064x", i+1))); r.status != http.StatusOK {
			t.Errorf("tenant B's upload %d beside A's: %d %s", i, r.status, r.body)
		}
	}
	// The disk is now 12 MiB of 12: a third of B's is the disk's refusal.
	if r := put(b.uploadURL(rawKeyB, resB.TemplateID, fmt.Sprintf("%064x", 9))); r.status != http.StatusTooManyRequests ||
		!strings.Contains(r.apiError(t).Message, "upload disk is full") {
		t.Errorf("past the gateway's upload disk: %d %s", r.status, r.body)
	}
}

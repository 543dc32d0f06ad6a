package vk

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kfake "k8s.io/client-go/kubernetes/fake"

	"github.com/sandman-dev/sandman/pool"
	vkapi "github.com/sandman-dev/sandman/vk/api"
)

// TestPrePullRefused: a pre-pull refused before its stream is answered in
// the one error shape of the virtual node's routes, a Kubernetes Status
// with the sandman code, which vk/client reads as a *vkapi.Error.
func TestPrePullRefused(t *testing.T) {
	h := newHarness(t, 1)
	empty, err := pool.New(pool.Config{Name: "empty", OnUpdate: func(pool.Update) {}})
	if err != nil {
		t.Fatal(err)
	}
	lonely, err := New(Config{NodeName: "vn-empty", Pool: empty, Client: kfake.NewClientset(), NodeIP: "10.0.0.2"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(lonely.Close)
	for _, tc := range []struct {
		name   string
		p      *Provider
		body   string
		status int
		code   string
		want   string
	}{
		{"no images", h.p, `{}`, 400, vkapi.CodeInvalidArgument, `want {"images"`},
		{"not JSON", h.p, `images`, 400, vkapi.CodeInvalidArgument, `want {"images"`},
		{"a bad reference", h.p, `{"images": ["not a ref"]}`, 400, vkapi.CodeInvalidArgument, `image "not a ref"`},
		{"no node agents", lonely, `{"images": ["img"]}`, 503, vkapi.CodeUnavailable, "the pool has no node agents"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mux := http.NewServeMux()
			tc.p.AttachAPI(mux)
			srv := httptest.NewServer(mux)
			defer srv.Close()
			resp, err := http.Post(srv.URL+vkapi.APIPrefix+"prepull", "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var st metav1.Status
			if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
				t.Fatalf("%s: %v", resp.Status, err)
			}
			if resp.StatusCode != tc.status || st.Kind != "Status" || st.Code != int32(tc.status) || !strings.Contains(st.Message, tc.want) ||
				st.Details == nil || len(st.Details.Causes) != 1 || st.Details.Causes[0].Type != vkapi.CauseCode || st.Details.Causes[0].Message != tc.code {
				t.Fatalf("%s: %+v, want a Status %d %q (%s)", resp.Status, st, tc.status, tc.want, tc.code)
			}
		})
	}
}

package vk

import (
	"slices"
	"strings"
	"testing"

	"github.com/sandman-dev/sandman/podcontract"
)

// TestControlPortsAnnotation: sandman.io/control-ports becomes the bind
// request's control ports, normalised into ranges the node accepts, or is
// refused naming the annotation.
func TestControlPortsAnnotation(t *testing.T) {
	for _, tc := range []struct {
		name, value string
		want        []string
		refused     string
	}{
		{name: "absent"},
		{name: "all but the daemon's", value: "1-49982, 49984-65535", want: []string{"1-49982", "49984-65535"}},
		{name: "one port", value: "8000", want: []string{"8000"}},
		{name: "a range of one", value: "8000-8000", want: []string{"8000"}},
		{name: "empty", value: " , ", refused: podcontract.AnnotationControlPorts + ": it lists nothing"},
		{name: "backwards", value: "9000-8000", refused: podcontract.AnnotationControlPorts + `: "9000-8000" is not a port`},
		{name: "zero", value: "0", refused: podcontract.AnnotationControlPorts + `: "0" is not a port`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod := testPod("p", "img")
			if tc.name != "absent" {
				pod.Annotations[podcontract.AnnotationControlPorts] = tc.value
			}
			req, err := translator().bindRequest(pod)
			if tc.refused != "" {
				if err == nil || !strings.Contains(err.Error(), tc.refused) {
					t.Fatalf("bindRequest: %v, want an error saying %q", err, tc.refused)
				}
				return
			}
			if err != nil {
				t.Fatalf("bindRequest: %v", err)
			}
			if !slices.Equal(req.ControlPorts, tc.want) {
				t.Errorf("control ports %q, want %q", req.ControlPorts, tc.want)
			}
			if err := req.Validate(); err != nil {
				t.Errorf("the node would refuse the request: %v", err)
			}
		})
	}
}

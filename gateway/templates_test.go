package gateway

import (
	"testing"
	"time"
)

// TestTemplatePrivilegeEscalation: a template entry's
// allowPrivilegeEscalation (E2B's base template: sudo works) becomes the
// sandbox container's securityContext.allowPrivilegeEscalation, kept next
// to the user a built template sets; without it the pod asks for nothing
// (the node runs it with no_new_privs).
func TestTemplatePrivilegeEscalation(t *testing.T) {
	got, errs := ParseTemplates(map[string]string{
		"base":  `{"image":"registry.example.com/base:1","allowPrivilegeEscalation":true}`,
		"plain": `{"image":"registry.example.com/plain:1"}`,
	})
	if len(errs) != 0 || !got["base"].AllowPrivilegeEscalation || got["plain"].AllowPrivilegeEscalation {
		t.Fatalf("templates %+v, errors %v", got, errs)
	}
	uid, gid := int64(1000), int64(1000)
	for _, tc := range []struct {
		name  string
		tmpl  Template
		allow bool
	}{
		{"base", got["base"], true},
		{"plain", got["plain"], false},
		{"built from base", func() Template {
			tm := got["base"]
			tm.Built = &builtTemplate{State: templateState{UID: &uid, GID: &gid}}
			return tm
		}(), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pod, err := buildPod(podSpec{id: "sbx", tokenHash: "h", key: Key{Name: "k", Namespace: "ns", Pool: "p"},
				template: tc.tmpl, templateID: tc.name, expiresAt: time.Now().Add(time.Hour)})
			if err != nil {
				t.Fatal(err)
			}
			sc := pod.Spec.Containers[0].SecurityContext
			allowed := sc != nil && sc.AllowPrivilegeEscalation != nil && *sc.AllowPrivilegeEscalation
			if allowed != tc.allow {
				t.Fatalf("allowPrivilegeEscalation = %v, want %v (securityContext %+v)", allowed, tc.allow, sc)
			}
			if tc.tmpl.Built != nil && (sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != uid) {
				t.Fatalf("the built template's user is lost: securityContext %+v", sc)
			}
		})
	}
}

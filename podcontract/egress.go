package podcontract

import (
	"crypto/sha256"
	"encoding/hex"
)

// AnnotationEgressApplied is written by the virtual node once it has
// changed a running sandbox's egress to what its egress annotations
// (AnnotationEgress, AnnotationEgressDeny, AnnotationEgressDomains) say:
// their EgressDigest. The annotations may change while the pod runs; the
// sandbox's firewall follows within moments, and a caller that changed
// them waits for this to match. A change the node refuses is a Warning
// event (reason EgressFailed), and the previous egress stays.
const AnnotationEgressApplied = "sandman.io/egress-applied"

// EgressDigest identifies the egress annotations among annotations: a hex
// SHA-256 of their values (absent and empty alike).
func EgressDigest(annotations map[string]string) string {
	h := sha256.New()
	for _, k := range []string{AnnotationEgress, AnnotationEgressDeny, AnnotationEgressDomains} {
		h.Write([]byte(annotations[k]))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// AppliedEgress is the digest of the egress a pod's sandbox has, from its
// annotations: AnnotationEgressApplied once the virtual node changed it,
// else (never changed) that of the egress annotations it started with.
func AppliedEgress(annotations map[string]string) string {
	if v := annotations[AnnotationEgressApplied]; v != "" {
		return v
	}
	return EgressDigest(annotations)
}

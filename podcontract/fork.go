package podcontract

// ForkInherited lists the annotations a live fork (AnnotationForkOf) takes
// from its source when sandmanctl fork or sandman-gateway makes it: the
// sandbox's lease and limits, which a fork must not escape, and what it
// does at its expiry. Its token, expiry, pause and snapshots are its own.
func ForkInherited() []string {
	return []string{AnnotationIdleTimeout, AnnotationEgress, AnnotationEgressDeny,
		AnnotationEgressDomains, AnnotationControlPorts,
		AnnotationIngressBandwidth, AnnotationEgressBandwidth,
		AnnotationOnExpiry, AnnotationResumeOnCall}
}

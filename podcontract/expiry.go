package podcontract

import "time"

// ResumeOnCall is how long a sandbox paused at its expiry runs again once
// a call resumes it (AnnotationResumeOnCall, with AnnotationOnExpiry
// "pause"); zero when a call does not resume it.
func ResumeOnCall(annotations map[string]string) time.Duration {
	if annotations[AnnotationOnExpiry] != OnExpiryPause {
		return 0
	}
	d, err := time.ParseDuration(annotations[AnnotationResumeOnCall])
	if err != nil || d <= 0 {
		return 0
	}
	return d
}

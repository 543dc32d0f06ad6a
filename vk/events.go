package vk

import (
	corev1 "k8s.io/api/core/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
)

// quietRecorder drops virtual-kubelet's routine events — one Normal event
// per pod created, updated or deleted, a write to the apiserver each in a
// burst of thousands — and passes on warnings and the provider's own events.
type quietRecorder struct {
	record.EventRecorder
}

var routine = map[string]bool{
	"ProviderCreateSuccess": true,
	"ProviderUpdateSuccess": true,
	"ProviderDeleteSuccess": true,
}

// Event implements record.EventRecorder.
func (r quietRecorder) Event(obj kruntime.Object, eventtype, reason, message string) {
	if eventtype == corev1.EventTypeNormal && routine[reason] {
		return
	}
	r.EventRecorder.Event(obj, eventtype, reason, message)
}

// Eventf implements record.EventRecorder.
func (r quietRecorder) Eventf(obj kruntime.Object, eventtype, reason, format string, args ...any) {
	if eventtype == corev1.EventTypeNormal && routine[reason] {
		return
	}
	r.EventRecorder.Eventf(obj, eventtype, reason, format, args...)
}

// AnnotatedEventf implements record.EventRecorder.
func (r quietRecorder) AnnotatedEventf(obj kruntime.Object, annotations map[string]string, eventtype, reason, format string, args ...any) {
	if eventtype == corev1.EventTypeNormal && routine[reason] {
		return
	}
	r.EventRecorder.AnnotatedEventf(obj, annotations, eventtype, reason, format, args...)
}

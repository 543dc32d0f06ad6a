package vk

import (
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/sandman-dev/sandman/podcontract"
)

// The pod contract's annotations and labels (sandman.io/idle-timeout,
// sandman.io/token-sha256, sandman.io/job) and the deadline
// (spec.activeDeadlineSeconds), each read from fuzzed values: a value is
// either used as it says or refused with an error naming the annotation.
func FuzzAnnotations(f *testing.F) {
	hash := "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	type seed struct {
		idle, tokens, job, ownerKind, ownerName string
		controller                              bool
		deadline                                int64
		hasDeadline                             bool
		created                                 int64
	}
	for _, s := range []seed{
		{"30m", hash, "train-1", "Job", "j", true, 3600, true, 1_700_000_000},
		{"", "", "", "", "", false, 0, false, 0},
		{"1h2m3.5s", hash + "," + strings.ToUpper(hash), "", "ReplicaSet", "rs", true, 1, true, 0},
		{"0s", " " + hash + " ", "", "Pod", "trainer", false, math.MaxInt32, true, -1},
		{"-5m", hash + ",", "a/b", "", "", false, -1, true, 1},
		{"30", "abc", "", "", "", false, 0, true, 1},
		{"2562047h47m16.854775807s", hash + ",,", "x", "Job", "j", false, math.MaxInt64, true, 1},
		{"9999999999h", "zz" + hash[2:], "", "", "", false, math.MinInt64, true, 1},
		{"1µs", hash[:63], "", "", "", false, math.MaxInt32 + 1, true, 1},
	} {
		f.Add(s.idle, s.tokens, s.job, s.ownerKind, s.ownerName, s.controller, s.deadline, s.hasDeadline, s.created)
	}
	p := &Provider{cfg: Config{NodeName: "vn", ControlKeys: mustKeys("pool-secret")}, log: slog.New(slog.DiscardHandler)}
	f.Fuzz(func(t *testing.T, idle, tokens, job, ownerKind, ownerName string, controller bool, deadline int64, hasDeadline bool, created int64) {
		pod := func(ns string) *corev1.Pod {
			pod := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "sb", UID: types.UID("uid-" + ns),
					Annotations: map[string]string{}, Labels: map[string]string{}},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "busybox"}}},
			}
			if idle != "" {
				pod.Annotations[podcontract.AnnotationIdleTimeout] = idle
			}
			if tokens != "" {
				pod.Annotations[podcontract.AnnotationTokenSHA256] = tokens
			}
			if job != "" {
				pod.Labels[podcontract.LabelJob] = job
			}
			if ownerKind != "" || ownerName != "" {
				pod.OwnerReferences = []metav1.OwnerReference{{Kind: ownerKind, Name: ownerName, UID: "owner", Controller: &controller}}
			}
			if hasDeadline {
				pod.Spec.ActiveDeadlineSeconds = &deadline
			}
			if created != 0 {
				pod.CreationTimestamp = metav1.Unix(created, 0)
			}
			return pod
		}
		a, b := pod("team-a"), pod("team-b")

		// sandman.io/idle-timeout: a positive Go duration, or refused.
		d, err := idleTimeout(a)
		switch {
		case idle == "":
			if d != 0 || err != nil {
				t.Fatalf("no idle timeout: %v, %v", d, err)
			}
		case err != nil:
			if !strings.Contains(err.Error(), podcontract.AnnotationIdleTimeout) || !strings.Contains(err.Error(), fmt.Sprintf("%q", idle)) {
				t.Fatalf("idle timeout %q: error %q does not name the annotation and its value", idle, err)
			}
		case d <= 0:
			t.Fatalf("idle timeout %q accepted as %v", idle, d)
		default:
			if back, err := time.ParseDuration(d.String()); err != nil || back != d {
				t.Fatalf("idle timeout %q = %v, which reads back as %v (%v)", idle, d, back, err)
			}
		}

		// sandman.io/token-sha256: comma-separated hex SHA-256 digests,
		// each used (trimmed, lower case), or the pod is refused naming
		// the annotation.
		req, err := p.bindRequest(a)
		if err == nil {
			req = p.withControlHashLocked(&sandbox{pod: a, req: req})
		}
		wellFormed := true
		var want []string
		for h := range strings.SplitSeq(tokens, ",") {
			h = strings.TrimSpace(h)
			if b, err := hex.DecodeString(h); err != nil || len(b) != 32 {
				wellFormed = false
			}
			want = append(want, strings.ToLower(h))
		}
		switch {
		case tokens == "":
			if err == nil {
				t.Fatal("a pod without a token hash was accepted by a node that requires one")
			}
		case !wellFormed:
			if err == nil || !strings.Contains(err.Error(), podcontract.AnnotationTokenSHA256) {
				t.Fatalf("token annotation %q: error %v, want one naming the annotation", tokens, err)
			}
		case err != nil:
			t.Fatalf("token annotation %q refused: %v", tokens, err)
		default:
			want = append(want, tokenHash(ControlToken([]byte("pool-secret"), string(a.UID))))
			if strings.Join(req.TokenHashes, ",") != strings.Join(want, ",") {
				t.Fatalf("token annotation %q: hashes %q, want %q", tokens, req.TokenHashes, want)
			}
		}

		// sandman.io/job: the label, else the controller (or first)
		// owner, else the namespace; never shared across namespaces.
		ja, jb := jobOf(a), jobOf(b)
		if ja == jb || ja != "team-a" && !strings.HasPrefix(ja, "team-a/") {
			t.Fatalf("jobs %q and %q of pods in team-a and team-b", ja, jb)
		}
		if job != "" && ja != "team-a/"+job {
			t.Fatalf("label %s=%q: job %q", podcontract.LabelJob, job, ja)
		}

		// spec.activeDeadlineSeconds, counted from creation (or from when
		// the provider saw the pod). The apiserver admits 1 to MaxInt32;
		// other values are only checked not to panic.
		seen := time.Unix(1_600_000_000, 0)
		dl := deadlineOf(a, seen)
		start := seen
		if !a.CreationTimestamp.IsZero() {
			start = a.CreationTimestamp.Time
		}
		switch {
		case !hasDeadline:
			if !dl.IsZero() {
				t.Fatalf("no deadline: %v", dl)
			}
		case deadline >= 1 && deadline <= math.MaxInt32:
			if !dl.Equal(start.Add(time.Duration(deadline) * time.Second)) {
				t.Fatalf("deadline %ds from %v: %v", deadline, start, dl)
			}
		}
	})
}

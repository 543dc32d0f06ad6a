package vk

import (
	"encoding/hex"
	"encoding/json"
	"log/slog"
	"math"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/sandman-dev/sandman/podcontract"
	"github.com/sandman-dev/sandman/runtime"
)

// The virtual node's pod translation (bindRequest, then the idle timeout,
// in CreatePod's order), fuzzed: any pod becomes either a bind request that
// says what the pod says, or an error whose message the pod's InvalidSpec
// status carries. Never a panic, and the pod is left as it was.

// translators are the two ways a virtual node is configured: with a pool
// secret and token hashes required (and an image pull secret lister), and
// open to unauthenticated sandboxes with neither.
func translators(f *testing.F) []*Provider {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, ns := range pullSecretNamespaces {
		for _, s := range []*corev1.Secret{
			{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "regcred"}, Data: map[string][]byte{corev1.DockerConfigJsonKey: []byte(`{"auths":{"r.example":{"auth":"dTpw"}}}`)}},
			{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "opaque"}, Data: map[string][]byte{"x": []byte("y")}},
		} {
			if err := idx.Add(s); err != nil {
				f.Fatal(err)
			}
		}
	}
	quiet := slog.New(slog.DiscardHandler)
	// Built by hand, not with New: translation reads only the config, and
	// New starts the status queue's goroutines.
	return []*Provider{
		{cfg: Config{NodeName: "vn", ControlKeys: mustKeys("pool-secret"), Secrets: corev1listers.NewSecretLister(idx)}, log: quiet},
		{cfg: Config{NodeName: "vn", AllowUnauthenticated: true}, log: quiet},
	}
}

var pullSecretNamespaces = []string{"default", "team"}

// checkTranslation translates pod with p and checks the outcome.
func checkTranslation(t *testing.T, p *Provider, pod *corev1.Pod) {
	t.Helper()
	before := pod.DeepCopy()
	req, err := p.bindRequest(pod)
	var idle time.Duration
	if err == nil {
		// The control plane's hash is added when the pod is submitted.
		req = p.withControlHashLocked(&sandbox{pod: pod, req: req})
		idle, err = idleTimeout(pod)
	}
	if !reflect.DeepEqual(pod, before) {
		t.Fatalf("translation changed the pod:\nbefore %+v\nafter  %+v", before, pod)
	}
	if err != nil {
		msg := err.Error()
		switch {
		case msg == "":
			t.Fatal("an empty error message: the pod's InvalidSpec status would say nothing")
		case len(pod.Spec.InitContainers) > 0 && !strings.Contains(msg, "init containers"):
			t.Fatalf("pod with init containers refused with %q, which does not say so", msg)
		}
		return
	}

	if len(pod.Spec.InitContainers) > 0 {
		t.Fatal("a pod with init containers was accepted")
	}
	if want := (runtime.PodRef{UID: string(pod.UID), Namespace: pod.Namespace, Name: pod.Name}); req.Pod != want {
		t.Fatalf("request for pod %+v, want %+v", req.Pod, want)
	}
	if req.Hostname != pod.Spec.Hostname || req.RestartPolicy != string(pod.Spec.RestartPolicy) || req.VirtualNode != p.cfg.NodeName {
		t.Fatalf("request hostname %q, restart policy %q, virtual node %q: want the pod's and %q", req.Hostname, req.RestartPolicy, req.VirtualNode, p.cfg.NodeName)
	}
	if len(req.Containers) != len(pod.Spec.Containers) {
		t.Fatalf("%d containers in the request, %d in the pod", len(req.Containers), len(pod.Spec.Containers))
	}
	for i, c := range pod.Spec.Containers {
		checkContainer(t, pod, c, req.Containers[i])
	}
	checkTokens(t, p, pod, req)
	wantSecrets := 0
	if p.cfg.Secrets != nil && contains(pullSecretNamespaces, pod.Namespace) {
		for _, ref := range pod.Spec.ImagePullSecrets {
			if ref.Name == "regcred" {
				wantSecrets++
			}
		}
	}
	if len(req.PullSecrets) != wantSecrets {
		t.Fatalf("%d pull secrets in the request, want %d (pod refs %+v)", len(req.PullSecrets), wantSecrets, pod.Spec.ImagePullSecrets)
	}
	if pod.Annotations[podcontract.AnnotationIdleTimeout] != "" && idle <= 0 {
		t.Fatalf("idle timeout annotation %q accepted as %v", pod.Annotations[podcontract.AnnotationIdleTimeout], idle)
	}
}

func contains(l []string, s string) bool {
	for _, e := range l {
		if e == s {
			return true
		}
	}
	return false
}

// checkContainer: a container of an accepted request is the pod's.
func checkContainer(t *testing.T, pod *corev1.Pod, c corev1.Container, cs runtime.ContainerSpec) {
	t.Helper()
	if cs.Name != c.Name || cs.Image != c.Image || cs.WorkingDir != c.WorkingDir ||
		!reflect.DeepEqual(cs.Command, c.Command) || !reflect.DeepEqual(cs.Args, c.Args) {
		t.Fatalf("container %+v\nbecame %+v", c, cs)
	}
	// Literal variables, in order; those only a reference could fill
	// (unresolved) are left out.
	var env []string
	for _, e := range c.Env {
		if e.ValueFrom == nil || e.Value != "" {
			env = append(env, e.Name+"="+e.Value)
		}
	}
	if !reflect.DeepEqual(cs.Env, env) {
		t.Fatalf("container %q env %q, want %q", c.Name, cs.Env, env)
	}

	// The user: the container's security context over the pod's.
	var uid, gid *int64
	if sc := pod.Spec.SecurityContext; sc != nil {
		uid, gid = sc.RunAsUser, sc.RunAsGroup
	}
	if sc := c.SecurityContext; sc != nil {
		uid = cmpOr(sc.RunAsUser, uid)
		gid = cmpOr(sc.RunAsGroup, gid)
	}
	if uid != nil {
		want := strconv.FormatInt(*uid, 10)
		if gid != nil {
			want += ":" + strconv.FormatInt(*gid, 10)
		}
		if cs.User != want {
			t.Fatalf("container %q runs as %q, want %q", c.Name, cs.User, want)
		}
	} else if cs.User != "" {
		t.Fatalf("container %q runs as %q without runAsUser", c.Name, cs.User)
	}
	// runAsGroup alone: the image's user with that group.
	if (uid == nil && gid != nil) != (cs.Group != nil) || cs.Group != nil && *cs.Group != *gid {
		t.Fatalf("container %q: group %v with runAsUser %v and runAsGroup %v", c.Name, cs.Group, uid, gid)
	}

	// Resources: what the pod asks, within rounding up to the unit (a
	// quantity too large to hold must be refused, not wrapped).
	checkAmount(t, c.Name, "cpu limit", cs.Limits.MilliCPU, c.Resources.Limits, corev1.ResourceCPU, 1000, 0)
	checkAmount(t, c.Name, "memory limit", cs.Limits.MemoryBytes, c.Resources.Limits, corev1.ResourceMemory, 1, 0)
	checkAmount(t, c.Name, "cpu request", cs.Requests.MilliCPU, c.Resources.Requests, corev1.ResourceCPU, 1000, cs.Limits.MilliCPU)
	checkAmount(t, c.Name, "memory request", cs.Requests.MemoryBytes, c.Resources.Requests, corev1.ResourceMemory, 1, cs.Limits.MemoryBytes)
	checkAmount(t, c.Name, "ephemeral-storage limit", cs.DiskBytes, c.Resources.Limits, corev1.ResourceEphemeralStorage, 1, 0)

	// Exclusive cores only for whole cores of a Guaranteed pod: every
	// container has CPU and memory limits, and requests equal to them.
	if cs.ExclusiveCPUs < 0 {
		t.Fatalf("container %q: %d exclusive CPUs", c.Name, cs.ExclusiveCPUs)
	}
	if cs.ExclusiveCPUs > 0 {
		if int64(cs.ExclusiveCPUs)*1000 != cs.Limits.MilliCPU || cs.Requests.MilliCPU != cs.Limits.MilliCPU {
			t.Fatalf("container %q: %d exclusive CPUs with limits %+v and requests %+v", c.Name, cs.ExclusiveCPUs, cs.Limits, cs.Requests)
		}
		for _, pc := range pod.Spec.Containers {
			for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				l, ok := pc.Resources.Limits[r]
				q, hasReq := pc.Resources.Requests[r]
				if !ok || hasReq && q.Cmp(l) != 0 {
					t.Fatalf("container %q got %d exclusive CPUs in a pod that is not Guaranteed (%q: %+v)", c.Name, cs.ExclusiveCPUs, pc.Name, pc.Resources)
				}
			}
		}
	}
}

func cmpOr(a, b *int64) *int64 {
	if a != nil {
		return a
	}
	return b
}

// checkAmount compares got with the quantity l[name] in units of 1/scale,
// independently of Quantity's integer conversions; absent or zero, the
// amount is dflt (requests default to limits).
func checkAmount(t *testing.T, container, what string, got int64, l corev1.ResourceList, name corev1.ResourceName, scale float64, dflt int64) {
	t.Helper()
	want := float64(dflt)
	if q, ok := l[name]; ok && !q.IsZero() {
		want = q.AsApproximateFloat64() * scale
	}
	if diff := math.Abs(float64(got) - want); diff > 1+1e-9*math.Abs(want) {
		t.Fatalf("container %q: %s %d, want %.0f (pod %s: %v)", container, what, got, want, name, quantityOf(l, name))
	}
}

func quantityOf(l corev1.ResourceList, name corev1.ResourceName) string {
	if q, ok := l[name]; ok {
		return q.String()
	}
	return "none"
}

// checkTokens: the request carries the annotation's hashes (lower case,
// trimmed), then the control plane's own when there is a pool secret; or
// none, unauthenticated, where the node allows it.
func checkTokens(t *testing.T, p *Provider, pod *corev1.Pod, req runtime.BindRequest) {
	t.Helper()
	v := pod.Annotations[podcontract.AnnotationTokenSHA256]
	if v == "" {
		if len(req.TokenHashes) != 0 || !req.AllowUnauthenticated || !p.cfg.AllowUnauthenticated {
			t.Fatalf("no token annotation: hashes %q, unauthenticated %v (node allows: %v)", req.TokenHashes, req.AllowUnauthenticated, p.cfg.AllowUnauthenticated)
		}
		return
	}
	var want []string
	for h := range strings.SplitSeq(v, ",") {
		want = append(want, strings.ToLower(strings.TrimSpace(h)))
	}
	if p.cfg.ControlKeys != nil {
		want = append(want, tokenHash(ControlToken(p.cfg.ControlKeys.Current(), string(pod.UID))))
	}
	if !reflect.DeepEqual(req.TokenHashes, want) || req.AllowUnauthenticated {
		t.Fatalf("annotation %q: hashes %q (unauthenticated %v), want %q", v, req.TokenHashes, req.AllowUnauthenticated, want)
	}
	for _, h := range req.TokenHashes {
		if b, err := hex.DecodeString(h); err != nil || len(b) != 32 || strings.ToLower(h) != h {
			t.Fatalf("token hash %q is not 64 lower-case hex digits", h)
		}
	}
}

// sandboxPod is what sandmanctl run creates, with a bit of everything.
const sandboxPod = `{
 "metadata": {"name": "sb-1", "namespace": "team", "uid": "0b5c6d3e-1",
  "annotations": {"sandman.io/token-sha256": "` + "9F86D081884C7D659A2FEAA0C55AD015A3BF4F1B2B0B822CD15D6C15B0F00A08" + `", "sandman.io/idle-timeout": "30m"},
  "labels": {"sandman.io/job": "train-7"},
  "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "trainer", "uid": "t-1", "controller": true}]},
 "spec": {
  "restartPolicy": "Never", "activeDeadlineSeconds": 3600, "hostname": "sb",
  "nodeSelector": {"sandman.io/pool": "default"},
  "imagePullSecrets": [{"name": "regcred"}, {"name": "missing"}, {"name": "opaque"}],
  "securityContext": {"runAsUser": 1000, "runAsGroup": 1000},
  "volumes": [{"name": "data", "emptyDir": {}}],
  "containers": [{
   "name": "main", "image": "python:3.12", "command": ["python", "-c"], "args": ["print(1)"], "workingDir": "/work",
   "env": [{"name": "A", "value": "1"}, {"name": "B", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}, {"name": "C", "value": "x", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
   "resources": {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "1Gi", "ephemeral-storage": "10Gi"}},
   "securityContext": {"runAsUser": 0},
   "volumeMounts": [{"name": "data", "mountPath": "/data"}]
  }, {
   "name": "side", "image": "busybox", "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}
  }]
 }
}`

// FuzzPodJSON: pods decoded from arbitrary JSON.
func FuzzPodJSON(f *testing.F) {
	for _, seed := range []string{
		sandboxPod,
		`{"metadata":{"name":"p","uid":"u"},"spec":{"containers":[{"name":"c","image":"i"}]}}`,
		`{"metadata":{"name":"p","uid":"u","annotations":{"sandman.io/token-sha256":" ` + strings.Repeat("a", 64) + ` ,` + strings.Repeat("B", 64) + `"}},"spec":{"containers":[{"name":"c","image":"i"}]}}`,
		`{"metadata":{"name":"p","uid":"u","annotations":{"sandman.io/token-sha256":"abc,"}},"spec":{"containers":[{"name":"c","image":"i"}]}}`,
		`{"metadata":{"name":"p","uid":"u","annotations":{"sandman.io/idle-timeout":"-1s"}},"spec":{"containers":[{"name":"c","image":"i"}]}}`,
		`{"metadata":{"name":"p","uid":"u"},"spec":{"initContainers":[{"name":"i","image":"i"}],"containers":[{"name":"c","image":"i"}]}}`,
		`{"metadata":{"name":"p","uid":"u"},"spec":{"containers":[{"name":"c","image":"i","resources":{"limits":{"cpu":"1e30","memory":"16E"}}}]}}`,
		`{"metadata":{"name":"p","uid":"u"},"spec":{"containers":[{"name":"c","image":"i","resources":{"requests":{"cpu":"9223372036854775807","memory":"-1"}}}]}}`,
		`{"metadata":{"name":"p","uid":"u"},"spec":{"containers":[{"name":"c","image":"i","resources":{"limits":{"cpu":"3","memory":"1Gi","ephemeral-storage":"-5"}}}]}}`,
		`{"metadata":{"name":"p","uid":"u"},"spec":{"containers":[{"name":"c","image":"i","resources":{"limits":{"cpu":"1m","memory":"1Ki"}}}]}}`,
		`{"metadata":{"name":"p","uid":"u"},"spec":{"securityContext":{"runAsGroup":5},"containers":[{"name":"c","image":""},{"name":"c","image":"i"}]}}`,
		`{"metadata":{"name":"p","uid":"u"},"spec":{"restartPolicy":"Sometimes","containers":[{"name":"c","image":"i"}]}}`,
		`{"metadata":{"name":"p"},"spec":{"containers":[]}}`, `{}`, `null`,
	} {
		f.Add([]byte(seed))
	}
	ps := translators(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		var pod corev1.Pod
		if json.Unmarshal(data, &pod) != nil {
			return
		}
		for _, p := range ps {
			checkTranslation(t, p, &pod)
		}
	})
}

// FuzzPodFields: pods built from fuzzed values in the fields translation
// reads (images, command, env, resources, users, annotations, pull
// secrets, restart policy, volumes).
func FuzzPodFields(f *testing.F) {
	hash := "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
	type seed struct {
		ns, name, uid, image, cmd, arg, envName, envVal, dir string
		cpuReq, cpuLim, memReq, memLim, disk                 string
		user, group                                          int64
		flags                                                uint8
		restart, tokens, idle, hostname, pullSecret, volume  string
		n                                                    uint8
	}
	for _, s := range []seed{
		{"team", "sb", "u-1", "busybox", "sleep", "1", "A", "b", "/w", "100m", "1", "64Mi", "128Mi", "1Gi", 1000, 1000, 0b0011, "Never", hash, "10m", "h", "regcred", "data", 1},
		{"default", "sb", "u-2", "img", "", "", "", "", "", "2", "2", "1Gi", "1Gi", "", 0, 0, 0b1100, "Always", "", "", "", "opaque", "", 2},
		{"ns", "p", "u-3", "", "x", "y", "K", "", "", "-1", "5m", "1", "1Ki", "-1", -1, -1, 0b1111, "OnFailure", "xyz", "0s", "", "", "", 3},
		{"ns", "p", "u-4", "i", "", "", "", "", "", "1e30", "16E", "9223372036854775807", "1e-30", "8E", 0, 0, 0b0100, "", " " + strings.ToUpper(hash) + " ", "1h30m", "", "", "", 1},
		{"ns", "p", "u-5", "i", "", "", "", "", "", "", "", "", "", "", 0, 0, 0b10000, "", hash + ",", "forever", "", "", "", 1},
	} {
		f.Add(s.ns, s.name, s.uid, s.image, s.cmd, s.arg, s.envName, s.envVal, s.dir, s.cpuReq, s.cpuLim, s.memReq, s.memLim, s.disk,
			s.user, s.group, s.flags, s.restart, s.tokens, s.idle, s.hostname, s.pullSecret, s.volume, s.n)
	}
	ps := translators(f)
	f.Fuzz(func(t *testing.T, ns, name, uid, image, cmd, arg, envName, envVal, dir, cpuReq, cpuLim, memReq, memLim, disk string,
		user, group int64, flags uint8, restart, tokens, idle, hostname, pullSecret, volume string, n uint8) {
		pod := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid), Annotations: map[string]string{}},
			Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicy(restart), Hostname: hostname},
		}
		if tokens != "" {
			pod.Annotations[podcontract.AnnotationTokenSHA256] = tokens
		}
		if idle != "" {
			pod.Annotations[podcontract.AnnotationIdleTimeout] = idle
		}
		if pullSecret != "" {
			pod.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: pullSecret}, {Name: "regcred"}}
		}
		if volume != "" {
			pod.Spec.Volumes = []corev1.Volume{{Name: volume, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}}}
		}
		// flags: 1 pod runAsUser, 2 pod runAsGroup, 4 container runAsUser,
		// 8 container runAsGroup, 16 an init container, 32 env from a
		// reference only, 64 requests only on the first container.
		if flags&3 != 0 {
			pod.Spec.SecurityContext = &corev1.PodSecurityContext{}
			if flags&1 != 0 {
				pod.Spec.SecurityContext.RunAsUser = &user
			}
			if flags&2 != 0 {
				pod.Spec.SecurityContext.RunAsGroup = &group
			}
		}
		if flags&16 != 0 {
			pod.Spec.InitContainers = []corev1.Container{{Name: "init", Image: image}}
		}
		list := func(cpu, mem, eph string) corev1.ResourceList {
			l := corev1.ResourceList{}
			for name, s := range map[corev1.ResourceName]string{corev1.ResourceCPU: cpu, corev1.ResourceMemory: mem, corev1.ResourceEphemeralStorage: eph} {
				if q, err := resource.ParseQuantity(s); err == nil {
					l[name] = q
				}
			}
			return l
		}
		for i := range int(n % 4) {
			c := corev1.Container{Name: name + strconv.Itoa(i), Image: image, WorkingDir: dir,
				Resources: corev1.ResourceRequirements{Limits: list(cpuLim, memLim, disk)}}
			if i == 0 || flags&64 == 0 {
				c.Resources.Requests = list(cpuReq, memReq, "")
			}
			if cmd != "" {
				c.Command = []string{cmd, arg}
			}
			if arg != "" {
				c.Args = []string{arg}
			}
			if envName != "" {
				c.Env = []corev1.EnvVar{{Name: envName, Value: envVal}}
				if flags&32 != 0 {
					c.Env = append(c.Env, corev1.EnvVar{Name: envName + "_REF", Value: envVal,
						ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}})
				}
			}
			if flags&12 != 0 {
				c.SecurityContext = &corev1.SecurityContext{}
				if flags&4 != 0 {
					u := user + int64(i)
					c.SecurityContext.RunAsUser = &u
				}
				if flags&8 != 0 {
					c.SecurityContext.RunAsGroup = &group
				}
			}
			if volume != "" {
				c.VolumeMounts = []corev1.VolumeMount{{Name: volume, MountPath: "/" + volume}}
			}
			pod.Spec.Containers = append(pod.Spec.Containers, c)
		}
		for _, p := range ps {
			checkTranslation(t, p, pod)
		}
	})
}

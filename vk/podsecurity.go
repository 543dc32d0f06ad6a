package vk

import (
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/sandman-dev/sandman/runtime"
)

// Pod security: what a sandbox can honour is carried to the node agent,
// what it cannot run safely fails the pod (InvalidSpec) with a message
// naming the field; nothing is dropped in silence but what the docs list as
// ignored (docs/trainer-guide.md, "Pod fields").

// ignoredVolumes are volume types a pod may declare though sandboxes mount
// no volumes: every pod gets a projected service account token volume, and
// none of these reaches the node's filesystem.
var ignoredVolumes = []string{"emptyDir", "configMap", "secret", "projected", "downwardAPI"}

// selinuxTypes are the SELinux types the restricted Pod Security level
// allows; the node applies no SELinux label, so only these are accepted
// (and ignored).
var selinuxTypes = []string{"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}

// Annotations of the AppArmor and seccomp settings older pods carry.
const (
	annotationAppArmorPrefix         = "container.apparmor.security.beta.kubernetes.io/"
	annotationSeccompPod             = "seccomp.security.alpha.kubernetes.io/pod"
	annotationSeccompContainerPrefix = "container.seccomp.security.alpha.kubernetes.io/"
)

// podSecurity refuses the pod-level fields a sandbox cannot honour.
func podSecurity(pod *corev1.Pod) error {
	spec := &pod.Spec
	for _, f := range []struct {
		set  bool
		name string
	}{{spec.HostNetwork, "hostNetwork"}, {spec.HostPID, "hostPID"}, {spec.HostIPC, "hostIPC"}} {
		if f.set {
			return fmt.Errorf("spec.%s: sandboxes never share the worker's namespaces: remove it", f.name)
		}
	}
	for _, v := range spec.Volumes {
		switch t := volumeType(v.VolumeSource); {
		case t == "hostPath":
			return fmt.Errorf("spec.volumes[%s].hostPath: sandboxes get no path of the worker's filesystem: remove the volume", v.Name)
		case !slices.Contains(ignoredVolumes, t):
			return fmt.Errorf("spec.volumes[%s].%s: sandboxes mount no volumes (only %s are accepted, and ignored): remove the volume",
				v.Name, t, strings.Join(ignoredVolumes, ", "))
		}
	}
	for k, v := range pod.Annotations {
		switch {
		case strings.HasPrefix(k, annotationAppArmorPrefix) && v != corev1.DeprecatedAppArmorBetaProfileRuntimeDefault:
			return fmt.Errorf("annotation %s: %q: sandboxes run under the node's default confinement only: remove the annotation or set %s",
				k, v, corev1.DeprecatedAppArmorBetaProfileRuntimeDefault)
		case (k == annotationSeccompPod || strings.HasPrefix(k, annotationSeccompContainerPrefix)) && v == corev1.SeccompProfileNameUnconfined:
			return fmt.Errorf("annotation %s: %q: sandboxes always run under a seccomp profile: remove the annotation", k, v)
		}
	}
	if psc := spec.SecurityContext; psc != nil {
		if len(psc.Sysctls) > 0 {
			return fmt.Errorf("spec.securityContext.sysctls: sandboxes share a slot's network namespace with the pods after them and get no sysctls: remove them")
		}
		if err := windowsOptions("spec.securityContext", psc.WindowsOptions); err != nil {
			return err
		}
	}
	return nil
}

// hostUsers refuses hostUsers: true, the opt-out of the sandbox's user
// namespace, to a pod whose namespace the pool does not name for it.
func (p *Provider) hostUsers(pod *corev1.Pod) error {
	if hu := pod.Spec.HostUsers; hu == nil || !*hu || slices.Contains(p.cfg.HostUsersNamespaces, pod.Namespace) {
		return nil
	}
	return fmt.Errorf("spec.hostUsers: true would run the sandbox on the worker's own users (root in it root on the worker), "+
		"which pool %s allows only to the namespaces its operator names (sandman-vk --host-users-namespaces), not %s: remove hostUsers or set it to false",
		p.poolName(), pod.Namespace)
}

// privilegeEscalation refuses a container's allowPrivilegeEscalation:
// true (no no_new_privs: setuid programs such as sudo work) to a pod whose
// namespace the pool does not name for it. Unset or false, sandboxes run
// with no_new_privs, unlike a kubelet's default: the pool decides.
func (p *Provider) privilegeEscalation(pod *corev1.Pod, c corev1.Container, allow bool) error {
	if !allow || slices.Contains(p.cfg.PrivilegeEscalationNamespaces, pod.Namespace) {
		return nil
	}
	return fmt.Errorf("spec.containers[%s].securityContext.allowPrivilegeEscalation: true would let setuid programs (sudo) gain privileges, "+
		"which pool %s allows only to the namespaces its operator names (sandman-vk --privilege-escalation-namespaces), not %s: remove it or set it to false",
		c.Name, p.poolName(), pod.Namespace)
}

// seccompLocalhost refuses a container's Localhost seccomp profile (its
// path relative to the node's profile directory, "" for none) unless the
// pool lists it: a profile on the node is the operator's to hand out, and
// a permissive one would undo the default filter.
func (p *Provider) seccompLocalhost(pod *corev1.Pod, c corev1.Container, profile string) error {
	if profile == "" || slices.ContainsFunc(p.cfg.SeccompLocalhostProfiles, func(a string) bool { return filepath.Clean(a) == filepath.Clean(profile) }) {
		return nil
	}
	at := "spec.securityContext"
	if sc := c.SecurityContext; sc != nil && sc.SeccompProfile != nil {
		at = "spec.containers[" + c.Name + "].securityContext"
	}
	allowed := "none"
	if len(p.cfg.SeccompLocalhostProfiles) > 0 {
		allowed = strings.Join(p.cfg.SeccompLocalhostProfiles, ", ")
	}
	return fmt.Errorf("%s.seccompProfile.localhostProfile: %q is not a Localhost profile pool %s allows (allowed: %s): use RuntimeDefault or an allowed one",
		at, profile, p.poolName(), allowed)
}

// volumeType is the name of the source a volume sets ("hostPath", …).
func volumeType(vs corev1.VolumeSource) string {
	v := reflect.ValueOf(vs)
	for i := range v.NumField() {
		if f := v.Field(i); f.Kind() == reflect.Pointer && !f.IsNil() {
			name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("json"), ",")
			return name
		}
	}
	return "unknown"
}

func windowsOptions(path string, w *corev1.WindowsSecurityContextOptions) error {
	if w != nil && w.HostProcess != nil && *w.HostProcess {
		return fmt.Errorf("%s.windowsOptions.hostProcess: sandboxes never run as host processes: remove it", path)
	}
	return nil
}

// containerSecurity carries the pod's and the container's security
// contexts (the container's over the pod's) into cs, or says which field a
// sandbox cannot honour.
func containerSecurity(pod *corev1.Pod, c corev1.Container, cs *runtime.ContainerSpec) error {
	path := "spec.containers[" + c.Name + "].securityContext"
	var (
		uid, gid   *int64
		nonRoot    *bool
		seccomp    *corev1.SeccompProfile
		seccompAt  = path
		apparmor   *corev1.AppArmorProfile
		apparmorAt = path
		selinux    *corev1.SELinuxOptions
		selinuxAt  = path
	)
	if psc := pod.Spec.SecurityContext; psc != nil {
		uid, gid, nonRoot = psc.RunAsUser, psc.RunAsGroup, psc.RunAsNonRoot
		seccomp, apparmor, selinux = psc.SeccompProfile, psc.AppArmorProfile, psc.SELinuxOptions
		seccompAt, apparmorAt, selinuxAt = "spec.securityContext", "spec.securityContext", "spec.securityContext"
		cs.SupplementalGroups = slices.Clone(psc.SupplementalGroups)
		// FSGroup and FSGroupChangePolicy concern volumes, which sandboxes
		// do not mount: ignored.
	}
	if sc := c.SecurityContext; sc != nil {
		if sc.Privileged != nil && *sc.Privileged {
			return fmt.Errorf("%s.privileged: sandboxes never run privileged: remove it", path)
		}
		// Checked against the pool by Provider.privilegeEscalation.
		cs.AllowPrivilegeEscalation = sc.AllowPrivilegeEscalation != nil && *sc.AllowPrivilegeEscalation
		if sc.ProcMount != nil && *sc.ProcMount == corev1.UnmaskedProcMount {
			return fmt.Errorf("%s.procMount: Unmasked would show the worker's /proc paths that sandboxes keep masked: remove it", path)
		}
		if err := windowsOptions(path, sc.WindowsOptions); err != nil {
			return err
		}
		if caps := sc.Capabilities; caps != nil {
			for _, name := range caps.Add {
				if cp := capability(name); !slices.Contains(runtime.SandboxCapabilities, cp) {
					return fmt.Errorf("%s.capabilities.add: %s is not among the capabilities sandboxes have (%s): remove it",
						path, name, strings.Join(runtime.SandboxCapabilities, ", "))
				}
				// One the sandbox has already: nothing to do.
			}
			for _, name := range caps.Drop {
				cp := capability(name)
				if cp == "ALL" {
					cs.DropCapabilities = []string{"ALL"}
					break
				}
				if !slices.Contains(cs.DropCapabilities, cp) {
					cs.DropCapabilities = append(cs.DropCapabilities, cp)
				}
			}
		}
		cs.ReadOnlyRootFS = sc.ReadOnlyRootFilesystem != nil && *sc.ReadOnlyRootFilesystem
		if sc.RunAsUser != nil {
			uid = sc.RunAsUser
		}
		if sc.RunAsGroup != nil {
			gid = sc.RunAsGroup
		}
		if sc.RunAsNonRoot != nil {
			nonRoot = sc.RunAsNonRoot
		}
		if sc.SeccompProfile != nil {
			seccomp, seccompAt = sc.SeccompProfile, path
		}
		if sc.AppArmorProfile != nil {
			apparmor, apparmorAt = sc.AppArmorProfile, path
		}
		if sc.SELinuxOptions != nil {
			selinux, selinuxAt = sc.SELinuxOptions, path
		}
	}
	cs.RunAsNonRoot = nonRoot != nil && *nonRoot
	switch {
	case uid != nil && cs.RunAsNonRoot && *uid == 0:
		return fmt.Errorf("%s.runAsNonRoot: the container runs as uid 0 (runAsUser): set a non-zero runAsUser or drop runAsNonRoot", path)
	case uid != nil && gid != nil:
		cs.User = strconv.FormatInt(*uid, 10) + ":" + strconv.FormatInt(*gid, 10)
	case uid != nil:
		cs.User = strconv.FormatInt(*uid, 10)
	case gid != nil:
		// The image's user, with this group: the node resolves the user.
		g := *gid
		cs.Group = &g
	}
	if seccomp != nil {
		switch seccomp.Type {
		case corev1.SeccompProfileTypeRuntimeDefault:
		case corev1.SeccompProfileTypeLocalhost:
			p := ""
			if seccomp.LocalhostProfile != nil {
				p = *seccomp.LocalhostProfile
			}
			if !filepath.IsLocal(p) {
				return fmt.Errorf("%s.seccompProfile.localhostProfile: %q: give a path relative to the node's seccomp profile directory, without \"..\"", seccompAt, p)
			}
			cs.SeccompLocalhost = p
		default:
			return fmt.Errorf("%s.seccompProfile: %s: sandboxes always run under a seccomp profile (RuntimeDefault or Localhost): change or remove it", seccompAt, seccomp.Type)
		}
	}
	if apparmor != nil && apparmor.Type != corev1.AppArmorProfileTypeRuntimeDefault {
		return fmt.Errorf("%s.appArmorProfile: %s: sandboxes run under the node's default confinement only: remove it or set RuntimeDefault", apparmorAt, apparmor.Type)
	}
	if se := selinux; se != nil && (se.User != "" || se.Role != "" || !slices.Contains(selinuxTypes, se.Type)) {
		return fmt.Errorf("%s.seLinuxOptions: sandboxes get no SELinux label but the default (user and role unset, type one of %s): remove it",
			selinuxAt, strings.Join(selinuxTypes[1:], ", "))
	}
	return nil
}

// capability is a Kubernetes capability name ("NET_ADMIN", "CAP_KILL",
// "all") as the OCI spec names it ("CAP_NET_ADMIN"), or "ALL".
func capability(name corev1.Capability) string {
	n := strings.ToUpper(strings.TrimSpace(string(name)))
	if n == "ALL" || strings.HasPrefix(n, "CAP_") {
		return n
	}
	return "CAP_" + n
}

// runtimeHandler is the handler of the pod's RuntimeClass, as a kubelet
// hands it to its container runtime: runc (or none) and runsc (gVisor) are
// what sandboxes run under. A pod asking for another runtime, or for a
// RuntimeClass that is not there, fails rather than run under runc
// believing it has what it asked for.
func (p *Provider) runtimeHandler(pod *corev1.Pod) (string, error) {
	name := pod.Spec.RuntimeClassName
	if name == nil || *name == "" {
		return "", nil
	}
	if p.cfg.RuntimeClasses == nil {
		return "", fmt.Errorf("spec.runtimeClassName %q: this virtual node reads no RuntimeClasses: remove it", *name)
	}
	rc, err := p.cfg.RuntimeClasses.Get(*name)
	if err != nil {
		return "", fmt.Errorf("spec.runtimeClassName %q: no RuntimeClass of that name (%v): create it or remove the field", *name, err)
	}
	switch rc.Handler {
	case runtime.RuntimeHandlerRunc:
		return "", nil
	case runtime.RuntimeHandlerRunsc, "gvisor":
		// gvisor: GKE Sandbox's name for the same handler.
		return runtime.RuntimeHandlerRunsc, nil
	}
	return "", fmt.Errorf("spec.runtimeClassName %q: its handler %q is not one sandboxes run under: %s (the default) or %s (gVisor)",
		*name, rc.Handler, runtime.RuntimeHandlerRunc, runtime.RuntimeHandlerRunsc)
}

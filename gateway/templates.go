package gateway

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/containerd/errdefs"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Default resource requests of a sandbox whose template names none.
var (
	DefaultCPU    = resource.MustParse("250m")
	DefaultMemory = resource.MustParse("256Mi")
)

// Template is what an E2B template ID stands for here: an image and the
// sandbox's resource requests.
type Template struct {
	// Name is the template's name in the ConfigMap; empty when the
	// template ID was an image reference used as it is.
	Name   string
	Image  string
	CPU    resource.Quantity
	Memory resource.Quantity
	// AllowPrivilegeEscalation runs its sandboxes without no_new_privs, so
	// sudo works, as E2B's base template expects: the pod asks for it
	// (securityContext.allowPrivilegeEscalation) and the pool's virtual
	// node refuses it unless its operator allows it to the key's namespace
	// (sandman-vk --privilege-escalation-namespaces).
	AllowPrivilegeEscalation bool
	// RuntimeClass is its sandboxes' runtimeClassName (empty: the pool's
	// default, runc). "gvisor" runs them under gVisor, whose sandboxes can
	// be paused with their memory (E2B's pause, resume, connect).
	RuntimeClass string
	// User is E2B's default user of its sandboxes, the image's own user
	// (E2B's base template: "user"): set, and not root, its sandboxes run
	// their daemon as root, as E2B's envd runs, and envd calls that name
	// no user act as User (daemon/api.EnvEnvdUser), so that user: 'root'
	// works as in E2B. Empty: the daemon runs as the image's user, and a
	// call can act as no other.
	User string
	// Built is set for a template built from code (see build.go): the
	// environment, working directory, user and start command its
	// sandboxes start with.
	Built *builtTemplate
}

// templateEntry is one ConfigMap data entry.
type templateEntry struct {
	Image                    string `json:"image"`
	CPU                      string `json:"cpu"`
	Memory                   string `json:"memory"`
	AllowPrivilegeEscalation bool   `json:"allowPrivilegeEscalation"`
	RuntimeClassName         string `json:"runtimeClassName"`
	User                     string `json:"user"`
}

// ParseTemplates reads template entries: entry name = template ID, value =
// JSON {"image":"…","cpu":"500m","memory":"512Mi","allowPrivilegeEscalation":true,"runtimeClassName":"gvisor","user":"user"}
// (cpu and memory optional: DefaultCPU, DefaultMemory; allowPrivilegeEscalation,
// for images whose users sudo, optional: false; runtimeClassName optional:
// the pool's default; user, the image's USER when it is not root, optional:
// see Template.User). Entries that cannot be used are
// left out, each with an error saying why.
func ParseTemplates(data map[string]string) (map[string]Template, []error) {
	out := map[string]Template{}
	var errs []error
	names := make([]string, 0, len(data))
	for name := range data {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		t, err := parseTemplate(name, data[name])
		if err != nil {
			errs = append(errs, fmt.Errorf("template %q: %w", name, err))
			continue
		}
		out[name] = t
	}
	return out, errs
}

func parseTemplate(name, raw string) (Template, error) {
	var e templateEntry
	if err := json.Unmarshal([]byte(raw), &e); err != nil {
		return Template{}, fmt.Errorf(`want JSON {"image":"…","cpu":"…","memory":"…"}: %w`, err)
	}
	if e.Image == "" {
		return Template{}, fmt.Errorf("no image")
	}
	t := Template{Name: name, Image: e.Image, CPU: DefaultCPU, Memory: DefaultMemory, AllowPrivilegeEscalation: e.AllowPrivilegeEscalation,
		RuntimeClass: e.RuntimeClassName, User: e.User}
	if e.User != "" && !userNameRE.MatchString(e.User) {
		return Template{}, fmt.Errorf("user %q: want a user name of the image's /etc/passwd, such as user", e.User)
	}
	if msgs := validation.IsDNS1123Subdomain(e.RuntimeClassName); e.RuntimeClassName != "" && len(msgs) > 0 {
		return Template{}, fmt.Errorf("runtimeClassName %q: %s", e.RuntimeClassName, strings.Join(msgs, "; "))
	}
	var err error
	if e.CPU != "" {
		if t.CPU, err = resource.ParseQuantity(e.CPU); err != nil || t.CPU.Sign() <= 0 {
			return Template{}, fmt.Errorf("cpu %q: want a positive quantity such as 500m", e.CPU)
		}
	}
	if e.Memory != "" {
		if t.Memory, err = resource.ParseQuantity(e.Memory); err != nil || t.Memory.Sign() <= 0 {
			return Template{}, fmt.Errorf("memory %q: want a positive quantity such as 512Mi", e.Memory)
		}
	}
	return t, nil
}

// defaultUser is the E2B default user of t's sandboxes: a built
// template's (setUser), else the ConfigMap's; "" when the image's own
// user is.
func (t Template) defaultUser() string {
	if t.Built != nil && t.Built.State.User != "" {
		return t.Built.State.User
	}
	return t.User
}

// templateStore holds the current templates; a watch replaces them as the
// ConfigMap changes.
type templateStore struct {
	// mu guards byName.
	mu     sync.RWMutex
	byName map[string]Template
}

func (s *templateStore) set(t map[string]Template) {
	s.mu.Lock()
	s.byName = t
	s.mu.Unlock()
}

// lookup finds a template of the ConfigMap.
func (s *templateStore) lookup(id string) (Template, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	t, ok := s.byName[id]
	return t, ok
}

// resolve finds a template ID's image: a template of the ConfigMap, or
// else, when the ID looks like an image reference (has '/', ':' or '@'),
// that image with the default requests.
func (s *templateStore) resolve(id string) (Template, error) {
	s.mu.RLock()
	t, ok := s.byName[id]
	s.mu.RUnlock()
	if ok {
		return t, nil
	}
	if strings.ContainsAny(id, "/:@") {
		return Template{Image: id, CPU: DefaultCPU, Memory: DefaultMemory}, nil
	}
	return Template{}, errorf(errdefs.ErrNotFound, "template '%s' not found: it is not in the gateway's templates ConfigMap, "+
		"and it is not an image reference (give an image such as registry.example.com/task:tag as the template to use an image directly)", id)
}

package nodeimage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
)

// Access says whether an image's registry serves it without credentials.
// A private image on the node starts only for pods whose pull secrets the
// registry accepts for it, as the kubelet's "ensure secret pulled images"
// does; a public one is shared with no check.
type Access string

const (
	// AccessUnknown: not recorded (an image from an agent that did not
	// record access). The first pod that wants it has the registry asked
	// once without credentials.
	AccessUnknown Access = ""
	// AccessPublic: the registry served it without credentials.
	AccessPublic Access = "public"
	// AccessPrivate: the registry wanted credentials for it.
	AccessPrivate Access = "private"
)

// LabelAccess is the containerd image label that records an image's Access,
// so a restarted agent remembers it. An operator who imports an image by
// hand (not from a registry) labels it public:
// ctr -n sandman images label <name> sandman.io/image-access=public.
const LabelAccess = "sandman.io/image-access"

// checkTimeout bounds one registry check of a pod's credentials.
const checkTimeout = 30 * time.Second

// AuthorizePod checks, without pulling, that a pod of namespace with these
// pull secrets may use ref: another namespace's snapshot (under a
// Config.SnapshotRepositories entry) and any image in the pool's convert
// repository are refused first, on the node or not, whatever the secrets,
// with an *Error of KindForbidden; then Authorize. Binds call it before
// they take a slot or pull.
func (m *Manager) AuthorizePod(ctx context.Context, ref, namespace string, secrets [][]byte) error {
	// A pod names the source, never its conversion: the node picks the
	// conversion itself, for a source the pod may start, that is public
	// as the digest pulled and no tenant's. The convert repository's name
	// of an image says nothing of whose it is (conversions made before
	// these rules may be of other namespaces' snapshots or of private
	// images), and the pool's registry serves it to any pod; refusing
	// every start by that name is the one rule that cannot let a pod reach
	// what its source name would not.
	if m.inConvertRepository(ref) {
		name, err := Normalize(ref)
		if err != nil {
			name = ref
		}
		return &Error{Image: name, Kind: KindForbidden, Err: fmt.Errorf(
			"it is in the pool's lazy conversion repository %s: start the image it was converted from, and the node uses the conversion when it may", m.cfg.ConvertRepository)}
	}
	if err := m.snapshots.CheckStart(ref, namespace); err != nil {
		return err
	}
	return m.Authorize(ctx, ref, secrets)
}

// Snapshots returns Config.SnapshotRepositories, parsed.
func (m *Manager) Snapshots() SnapshotRepositories { return m.snapshots }

// Authorize checks, without pulling, that a pod with these pull secrets may
// use ref as it is on this node: nil for a public image and for an image
// not on the node (Ensure's pull proves the secrets); for a private image,
// the registry's answer to the pod's credentials for it (a manifest HEAD,
// kept AccessTTL, a refusal AccessRefusedTTL). A refusal is an *Error of
// KindUnauthorized (or KindNotFound) with the registry's message, as a
// refused pull is. Public images cost no network and no containerd call.
// It does not know the pod's namespace: binds use AuthorizePod.
func (m *Manager) Authorize(ctx context.Context, ref string, secrets [][]byte) error {
	name, err := Normalize(ref)
	if err != nil {
		return err
	}
	m.mu.Lock()
	e, ok := m.images[name]
	public := ok && e.access == AccessPublic
	m.mu.Unlock()
	if !ok || public {
		return nil
	}
	ctx = m.ns(ctx)
	img, err := m.cfg.Client.GetImage(ctx, name)
	if errdefs.IsNotFound(err) {
		return nil // gone: Ensure pulls it with the pod's secrets
	}
	if err != nil {
		return classify(name, err)
	}
	return m.authorize(ctx, name, img, parseDockerConfigs(secrets))
}

// authorize checks creds against name's registry when name is private (or
// not known to be public).
func (m *Manager) authorize(ctx context.Context, name string, img ctrd.Image, creds map[string][2]string) error {
	m.mu.Lock()
	access := AccessUnknown
	if e, ok := m.images[name]; ok {
		access = e.access
	}
	m.mu.Unlock()
	if access == AccessPublic {
		return nil
	}
	dgst := img.Target().Digest.String()
	key := credentialsKey(creds)
	if access == AccessUnknown {
		// An image from before access was recorded: one anonymous check
		// says which it is. A registry that does not answer leaves it
		// unknown, and the bind fails (closed) as a pull would.
		err := m.access.do(ctx, accessKey{name, dgst, ""}, func(ctx context.Context) error { return m.check(ctx, name, nil) })
		switch {
		case err == nil:
			m.setAccess(ctx, name, AccessPublic)
			return nil
		case refused(err):
			m.setAccess(ctx, name, AccessPrivate)
			if key == "" {
				return err
			}
		default:
			return err
		}
	}
	return m.access.do(ctx, accessKey{name, dgst, key}, func(ctx context.Context) error { return m.check(ctx, name, creds) })
}

// learnAccess decides, after a pull, whether name is public: a pull that
// gave the registry no credentials is; one that did asks the registry once
// more without them (registries challenge public images too). Anything but
// an anonymous success counts as private. The answer is kept in the image's
// label.
func (m *Manager) learnAccess(ctx context.Context, name string, usedCreds bool) Access {
	access := AccessPublic
	if usedCreds {
		if err := m.check(ctx, name, nil); err != nil {
			access = AccessPrivate
		}
	}
	m.setAccess(ctx, name, access)
	return access
}

// setAccess records name's access in memory and in its label. A label
// that cannot be written only costs a restarted agent one anonymous check.
func (m *Manager) setAccess(ctx context.Context, name string, access Access) {
	m.mu.Lock()
	if e, ok := m.images[name]; ok {
		e.access = access
	}
	m.mu.Unlock()
	_, err := m.cfg.Client.ImageService().Update(ctx, images.Image{Name: name, Labels: map[string]string{LabelAccess: string(access)}},
		"labels."+LabelAccess)
	if err != nil {
		m.cfg.Logger.Warn("record image access", "image", name, "access", access, "err", err)
	}
}

// check asks name's registry for its manifest (HEAD, as a pull resolves
// it) with creds: nil when it answers, else an *Error.
func (m *Manager) check(ctx context.Context, name string, creds map[string][2]string) error {
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	defer context.AfterFunc(m.ctx, cancel)()
	_, _, err := m.resolver(ctx, creds, nil).Resolve(ctx, name)
	if err != nil {
		e := classify(name, err)
		if refused(e) {
			m.metrics.accessChecks.WithLabelValues("refused").Inc()
			e = &Error{Image: name, Kind: e.Kind, Err: fmt.Errorf("the image is on this node but private, and its registry refused these credentials for it: %w", err)}
		} else {
			m.metrics.accessChecks.WithLabelValues("failed").Inc()
		}
		return e
	}
	m.metrics.accessChecks.WithLabelValues("allowed").Inc()
	return nil
}

// refused: the registry answered no to these credentials (as opposed to not
// answering).
func refused(err error) bool {
	k := KindOf(err)
	return k == KindUnauthorized || k == KindNotFound
}

// goManaged runs f as part of the manager's work (Run waits for it); false
// once the manager stopped.
func (m *Manager) goManaged(f func()) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.stopped {
		return false
	}
	m.wg.Go(f)
	return true
}

// credentialsKey identifies a set of registry credentials (host → user,
// password) without keeping them: "" for none.
func credentialsKey(creds map[string][2]string) string {
	if len(creds) == 0 {
		return ""
	}
	h := sha256.New()
	for _, host := range slices.Sorted(maps.Keys(creds)) {
		c := creds[host]
		fmt.Fprintf(h, "%q %q %q\n", host, c[0], c[1])
	}
	return hex.EncodeToString(h.Sum(nil))
}

// accessKey is one question to a registry: may these credentials read this
// image as the node holds it.
type accessKey struct {
	image  string
	digest string
	creds  string // credentialsKey
}

// accessCache remembers the registry's answers (yes for okTTL, no for
// refusedTTL; a registry that did not answer is asked again) and asks once
// however many callers want the same answer at once.
type accessCache struct {
	now               func() time.Time
	okTTL, refusedTTL time.Duration
	// start runs a check in the background; false when it cannot (the
	// manager stopped).
	start func(func()) bool

	mu sync.Mutex
	// entries are answers and checks in flight (done still open).
	entries map[accessKey]*accessCheck
}

type accessCheck struct {
	done chan struct{}
	// err and expires are set before done is closed.
	err     error
	expires time.Time
}

// put records a yes for k (a pull with these credentials just succeeded).
func (c *accessCache) put(k accessKey) {
	done := make(chan struct{})
	close(done)
	c.mu.Lock()
	defer c.mu.Unlock()
	c.entries[k] = &accessCheck{done: done, expires: c.now().Add(c.okTTL)}
}

// do returns the answer for k, asking with check when none is kept. The
// check runs in the background with ctx's values but not its cancellation:
// one caller giving up does not fail the others.
func (c *accessCache) do(ctx context.Context, k accessKey, check func(context.Context) error) error {
	c.mu.Lock()
	now := c.now()
	a, ok := c.entries[k]
	if ok && closed(a.done) && !now.Before(a.expires) {
		ok = false
	}
	if !ok {
		c.sweepLocked(now)
		a = &accessCheck{done: make(chan struct{})}
		c.entries[k] = a
	}
	c.mu.Unlock()
	if !ok {
		bg := context.WithoutCancel(ctx)
		run := func() {
			err := check(bg)
			c.mu.Lock()
			a.err = err
			switch {
			case err == nil:
				a.expires = c.now().Add(c.okTTL)
			case refused(err):
				a.expires = c.now().Add(c.refusedTTL)
			default:
				delete(c.entries, k) // no answer: ask again next time
			}
			close(a.done)
			c.mu.Unlock()
		}
		if !c.start(run) {
			c.mu.Lock()
			a.err = &Error{Image: k.image, Kind: KindUnreachable, Err: fmt.Errorf("the node's image manager has stopped: %w", errdefs.ErrUnavailable)}
			delete(c.entries, k)
			close(a.done)
			c.mu.Unlock()
		}
	}
	select {
	case <-a.done:
		return a.err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// sweepLocked drops expired answers.
func (c *accessCache) sweepLocked(now time.Time) {
	for k, a := range c.entries {
		if closed(a.done) && !now.Before(a.expires) {
			delete(c.entries, k)
		}
	}
}

func closed(c chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

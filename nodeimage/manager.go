package nodeimage

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	ctrd "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/remotes"
	"github.com/containerd/containerd/v2/core/remotes/docker"
	"github.com/containerd/containerd/v2/core/remotes/docker/config"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/snapshotters"
	"github.com/containerd/errdefs"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	"k8s.io/utils/clock"

	"github.com/sandman-dev/sandman/internal/lifecycle"
	"github.com/sandman-dev/sandman/runtime"
)

// Config configures a Manager.
type Config struct {
	// Client is connected to the worker's containerd, with the namespace
	// sandboxes live in as its default (required).
	Client *ctrd.Client
	// Namespace is the containerd namespace images live in (default
	// "sandman").
	Namespace string
	// Node names this worker (metrics label).
	Node string
	// Snapshotter images are unpacked into (default overlayfs).
	Snapshotter string
	// LazyPull: the snapshotter is a remote one that mounts eStargz layers
	// lazily (stargz-snapshotter). Pulls give it each layer's reference,
	// digest and the image's layers as snapshot labels; a layer it mounts
	// is not fetched (the sandbox reads it over the network as it goes),
	// any other layer is fetched and unpacked as usual.
	LazyPull bool
	// ConvertRepository (host[:port]/path; needs LazyPull), when set, is
	// where the pool keeps eStargz conversions of ordinary images: a pull
	// of a public image whose conversion is there mounts the conversion
	// lazily; one whose conversion is not is pulled whole, then converted
	// on this node from what it fetched and pushed there, for the pool's
	// next pulls. Never converted: private images (not served anonymously
	// as the digest pulled) and tenants' (SnapshotRepositories,
	// TenantRepositories). Pods may not name an image in it (AuthorizePod).
	ConvertRepository string
	// ConvertSecrets returns the credentials (docker config JSON) to read
	// and push ConvertRepository (nil: anonymous).
	ConvertSecrets func() ([][]byte, error)
	// ConvertDir holds conversions in progress: room for an image's
	// largest layer uncompressed plus the image compressed (default
	// os.TempDir()).
	ConvertDir string
	// LazyMetricsURL is the lazy-pulling snapshotter's Prometheus endpoint
	// (stargz-snapshotter's metrics_address, http://host:port/metrics):
	// the image metrics add what it fetched on demand and how long its
	// fetches took (sandman_node_image_lazy_*). Empty: none.
	LazyMetricsURL string
	// LazyCacheDir holds the lazy-pulling snapshotter's cache of what
	// sandboxes read (stargz-snapshotter: <root>/stargz). It counts against
	// CacheBytes: removing a lazy image lets the snapshotter drop its
	// layers' cache (once their mounts go). Empty: not counted.
	LazyCacheDir string
	// HostsDir holds per-registry settings in containerd's hosts.toml
	// layout (<dir>/<host>/hosts.toml: mirrors, plain HTTP, CA files,
	// skip_verify). Empty: defaults, where localhost and loopback
	// registries may speak plain HTTP.
	HostsDir string
	// CacheBytes is the disk budget for images (content and unpacked
	// layers); 0: no budget.
	CacheBytes int64
	// GCInterval is how often usage is checked against the budget
	// (default 1 min); a pull that finishes also triggers a check.
	GCInterval time.Duration
	// PrePull images are kept unpacked (never collected).
	PrePull []string
	// PrePullConcurrency bounds pre-pulls in flight (default 1). Binds
	// never wait behind pre-pulls of other images.
	PrePullConcurrency int
	// Attempts bounds tries for retryable failures (default 3), with
	// backoff from RetryBackoff (default 1 s, doubling).
	Attempts     int
	RetryBackoff time.Duration
	// InUse reports images that slots use now (hot, binding, bound); they
	// are never collected. Containers in the namespace count too.
	InUse func() []string
	// OnProgress is called about every ProgressInterval (default 500 ms)
	// while an image is pulled, and once when it is done.
	OnProgress       func(Progress)
	ProgressInterval time.Duration
	// OnChange is called when the set of ready images changed.
	OnChange func()
	// AccessTTL is how long the registry's acceptance of a pod's
	// credentials for a private image on the node is trusted (default
	// 10 min); AccessRefusedTTL how long its refusal is (default 30 s), so
	// a burst of binds costs one check and a fixed grant counts soon.
	AccessTTL        time.Duration
	AccessRefusedTTL time.Duration
	// SnapshotRepositories are where snapshots are kept by namespace
	// (host[:port][/prefix]; see SnapshotRepositories): AuthorizePod
	// refuses another namespace's to a pod. None: no such check.
	SnapshotRepositories []string
	// TenantRepositories (host[:port][/prefix]) hold tenants' images that
	// their registry may serve without credentials, such as the snapshot
	// registry (template builds, snapshots) and the checkpoint repository:
	// they are never converted into ConvertRepository, where anyone could
	// start them. SnapshotRepositories count too.
	TenantRepositories []string
	Logger             *slog.Logger
	// Clock tells the time and times the retry back-off (default
	// clock.RealClock).
	Clock clock.Clock
}

func (c *Config) setDefaults() error {
	if c.Client == nil {
		return errors.New("nodeimage: a containerd client is required")
	}
	if c.Namespace == "" {
		c.Namespace = "sandman"
	}
	if c.Snapshotter == "" {
		c.Snapshotter = "overlayfs"
	}
	if c.GCInterval <= 0 {
		c.GCInterval = time.Minute
	}
	if c.PrePullConcurrency <= 0 {
		c.PrePullConcurrency = 1
	}
	if c.Attempts <= 0 {
		c.Attempts = 3
	}
	if c.RetryBackoff <= 0 {
		c.RetryBackoff = time.Second
	}
	if c.ProgressInterval <= 0 {
		c.ProgressInterval = 500 * time.Millisecond
	}
	if c.InUse == nil {
		c.InUse = func() []string { return nil }
	}
	if c.OnProgress == nil {
		c.OnProgress = func(Progress) {}
	}
	if c.OnChange == nil {
		c.OnChange = func() {}
	}
	if c.AccessTTL <= 0 {
		c.AccessTTL = 10 * time.Minute
	}
	if c.AccessRefusedTTL <= 0 {
		c.AccessRefusedTTL = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Clock == nil {
		c.Clock = clock.RealClock{}
	}
	return nil
}

// Progress is how far a pull is.
type Progress struct {
	Image string
	// BytesDone of BytesTotal (compressed layers, config and manifests
	// known so far; the total grows as manifests are read).
	BytesDone, BytesTotal int64
	Done                  bool
	// Err is set when the pull failed.
	Err error
}

// Manager prepares images on one node.
type Manager struct {
	cfg     Config
	metrics *metrics
	// access remembers the registry's answers about private images.
	access *accessCache
	// snapshots are Config.SnapshotRepositories, tenants
	// Config.TenantRepositories and convertRepo Config.ConvertRepository,
	// parsed (matched as Owner does: any name of their registry).
	snapshots, tenants, convertRepo SnapshotRepositories
	// ctx ends when Run returns: pulls in flight stop. wg counts the
	// pulls and Run's pre-pull loop; Run waits for them.
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu sync.Mutex
	// stopped is set when Run returns: no pull starts after it (guards
	// the additions to wg).
	stopped bool
	// images are the ready ones, by normalized name.
	images map[string]*entry
	// pulls are in flight, by normalized name.
	pulls map[string]*pull
	// failed remembers the last failure of an image not ready.
	failed map[string]*Error
	pinned map[string]bool
	// wakePrePull and wakeGC nudge the loops.
	wakePrePull chan struct{}
	wakeGC      chan struct{}
	// converting are the conversions queued or running, by target;
	// convertSlot lets one run at a time.
	converting  map[string]bool
	convertSlot chan struct{}
	// lazyBytes is the lazy cache's size and lazyFetched what the
	// snapshotter fetched on demand by layer digest, as GC last measured.
	lazyBytes   int64
	lazyFetched map[string]int64
}

type entry struct {
	size     int64 // bytes on disk: content plus unpacked snapshots; 0 until measured
	lastUsed time.Time
	access   Access
	// lazyLayers are the layers the snapshotter mounted lazily (measured
	// with size): what they cost is in the lazy cache.
	lazyLayers []ocispec.Descriptor
}

// pull is one pull in flight; every Ensure of its image waits on done.
type pull struct {
	done chan struct{}
	// creds identifies the credentials it pulls with (credentialsKey).
	creds    string
	img      ctrd.Image
	err      error
	progress Progress
}

// New returns a Manager. Run starts its pre-pull and GC loops; Ensure works
// without them.
func New(ctx context.Context, cfg Config) (*Manager, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, err
	}
	m := &Manager{
		cfg: cfg, metrics: newMetrics(cfg.Node),
		images: map[string]*entry{}, pulls: map[string]*pull{}, failed: map[string]*Error{}, pinned: map[string]bool{},
		wakePrePull: make(chan struct{}, 1), wakeGC: make(chan struct{}, 1),
		converting: map[string]bool{}, convertSlot: make(chan struct{}, 1),
	}
	if cfg.ConvertRepository != "" && !cfg.LazyPull {
		return nil, errors.New("nodeimage: a convert repository needs LazyPull")
	}
	if cfg.ConvertRepository != "" && cfg.ConvertDir != "" {
		// Conversions cut short by an agent that died leave their files.
		if err := errors.Join(os.RemoveAll(cfg.ConvertDir), os.MkdirAll(cfg.ConvertDir, 0o700)); err != nil {
			return nil, fmt.Errorf("nodeimage: conversions directory: %w", err)
		}
	}
	if err := m.parseRepositories(); err != nil {
		return nil, fmt.Errorf("nodeimage: %w", err)
	}
	m.ctx, m.cancel = context.WithCancel(context.Background())
	m.access = &accessCache{
		now: cfg.Clock.Now, okTTL: cfg.AccessTTL, refusedTTL: cfg.AccessRefusedTTL,
		start: m.goManaged, entries: map[accessKey]*accessCheck{},
	}
	for _, ref := range cfg.PrePull {
		name, err := Normalize(ref)
		if err != nil {
			return nil, fmt.Errorf("pre-pull: %w", err)
		}
		m.pinned[name] = true
	}
	if err := m.load(ctx); err != nil {
		return nil, err
	}
	return m, nil
}

// parseRepositories parses the configured repositories.
func (m *Manager) parseRepositories() error {
	var err error
	if m.snapshots, err = ParseSnapshotRepositories(m.cfg.SnapshotRepositories); err != nil {
		return err
	}
	if m.tenants, err = ParseSnapshotRepositories(m.cfg.TenantRepositories); err != nil {
		return fmt.Errorf("tenant repositories: %w", err)
	}
	if m.cfg.ConvertRepository != "" {
		if m.convertRepo, err = ParseSnapshotRepositories([]string{m.cfg.ConvertRepository}); err != nil {
			return fmt.Errorf("convert repository %q: want host[:port]/path", m.cfg.ConvertRepository)
		}
	}
	return nil
}

// ns puts the namespace into ctx.
func (m *Manager) ns(ctx context.Context) context.Context {
	return namespaces.WithNamespace(ctx, m.cfg.Namespace)
}

// Normalize returns the full name of an image reference
// (busybox → docker.io/library/busybox:latest).
func Normalize(ref string) (string, error) {
	name, err := runtime.NormalizeImage(ref)
	if err != nil {
		return "", &Error{Image: ref, Kind: KindInvalid, Err: err}
	}
	return name, nil
}

// load reads the images containerd holds unpacked; an image that is there
// but not fully unpacked (a pull cut short) is not ready, and the next
// Ensure completes it.
func (m *Manager) load(ctx context.Context) error {
	ctx = m.ns(ctx)
	// A pull holds a lease (24 h) over what it fetched; a pull cut short by
	// an agent that died would keep its partial content that long. No pull
	// of this namespace is live before the manager starts.
	if ls, err := m.cfg.Client.LeasesService().List(ctx, `labels."containerd.io/gc.expire"`); err == nil {
		for _, l := range ls {
			if err := m.cfg.Client.LeasesService().Delete(ctx, l); err == nil {
				m.cfg.Logger.Info("removed the lease of an unfinished pull", "lease", l.ID)
			}
		}
	}
	imgs, err := m.cfg.Client.ListImages(ctx)
	if err != nil {
		return fmt.Errorf("list images: %w", err)
	}
	for _, img := range imgs {
		if ok, err := img.IsUnpacked(ctx, m.cfg.Snapshotter); err != nil || !ok {
			continue
		}
		m.images[img.Name()] = &entry{lastUsed: img.Metadata().UpdatedAt, access: Access(img.Labels()[LabelAccess])}
	}
	return nil
}

// Ensure returns ref unpacked into the snapshotter for a pod, pulling it
// when needed: one pull per image however many callers wait (they share its
// result and error; one caller giving up does not cancel the pull for the
// others). secrets are docker config JSON documents (the pod's
// imagePullSecrets). A private image (one its registry serves only with
// credentials) is handed out only when the registry accepts the pod's
// credentials for it, pulled now or not (see Authorize). Errors are *Error.
func (m *Manager) Ensure(ctx context.Context, ref string, secrets [][]byte) (ctrd.Image, error) {
	name, err := Normalize(ref)
	if err != nil {
		return nil, err
	}
	ctx = m.ns(ctx)
	creds := parseDockerConfigs(secrets)
	img, err := m.ensure(ctx, name, creds)
	if err != nil {
		return nil, err
	}
	if err := m.authorize(ctx, name, img, creds); err != nil {
		return nil, err
	}
	return img, nil
}

// EnsureForNode returns ref unpacked for the node's own use (a hot
// sandbox, a pre-pull), with no pod and so no access check: an image not on
// the node is pulled without credentials. What it returns must not reach a
// pod before Authorize accepts the pod's secrets for it.
func (m *Manager) EnsureForNode(ctx context.Context, ref string) (ctrd.Image, error) {
	name, err := Normalize(ref)
	if err != nil {
		return nil, err
	}
	return m.ensure(m.ns(ctx), name, nil)
}

// ensure returns name unpacked, pulling it with creds when it is not.
func (m *Manager) ensure(ctx context.Context, name string, creds map[string][2]string) (ctrd.Image, error) {
	key := credentialsKey(creds)
	for retried := false; ; retried = true {
		m.mu.Lock()
		if e, ok := m.images[name]; ok {
			e.lastUsed = m.cfg.Clock.Now()
			m.mu.Unlock()
			img, err := m.cfg.Client.GetImage(ctx, name)
			if err == nil {
				return img, nil
			}
			if !errdefs.IsNotFound(err) {
				return nil, classify(name, err)
			}
			// Removed behind our back: pull again.
			m.mu.Lock()
			delete(m.images, name)
		}
		p, ok := m.pulls[name]
		if !ok {
			if m.stopped {
				m.mu.Unlock()
				return nil, &Error{Image: name, Kind: KindUnreachable, Err: fmt.Errorf("the node's image manager has stopped: %w", errdefs.ErrUnavailable)}
			}
			p = &pull{done: make(chan struct{}), creds: key, progress: Progress{Image: name}}
			m.pulls[name] = p
			// The pull serves every waiter: it keeps ctx's values (the
			// namespace) but ends only with the manager.
			pctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
			stop := context.AfterFunc(m.ctx, cancel)
			m.wg.Go(func() {
				defer cancel()
				defer stop()
				m.run(pctx, name, p, creds)
			})
		}
		m.mu.Unlock()
		select {
		case <-p.done:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if p.err != nil && KindOf(p.err) == KindUnauthorized && p.creds != key && !retried {
			// The registry refused another pod's credentials (or none);
			// this caller's may do: its own pull.
			continue
		}
		return p.img, p.err
	}
}

// run pulls name with retries and publishes the result to p's waiters.
func (m *Manager) run(ctx context.Context, name string, p *pull, creds map[string][2]string) {
	begin := time.Now()
	var (
		img       ctrd.Image
		perr      *Error
		usedCreds bool
	)
	for attempt := 1; ; attempt++ {
		var err error
		img, usedCreds, err = m.pullOnce(ctx, name, p, creds)
		if err == nil {
			perr = nil
			break
		}
		perr = classify(name, err)
		if perr.Kind == KindDiskFull && attempt == 1 {
			// Make room, then try once more.
			if _, gerr := m.GC(ctx); gerr != nil {
				m.cfg.Logger.Warn("image gc after disk full", "err", gerr)
			}
		}
		if !perr.Retryable() || attempt >= m.cfg.Attempts || (perr.Kind == KindDiskFull && attempt >= 2) {
			break
		}
		m.cfg.Logger.Info("image pull failed, retrying", "image", name, "attempt", attempt, "err", err)
		if !lifecycle.Sleep(ctx, m.cfg.Clock, m.cfg.RetryBackoff<<(attempt-1)) {
			break // the manager stopped: the last failure stands
		}
	}
	elapsed := time.Since(begin)
	var access Access
	if perr == nil {
		access = m.learnAccess(ctx, name, usedCreds)
		if access == AccessPrivate {
			// The registry accepted the puller's credentials for it.
			m.access.put(accessKey{name, img.Target().Digest.String(), p.creds})
		}
	}
	m.mu.Lock()
	delete(m.pulls, name)
	p.img = img
	final := p.progress
	final.Done = true
	if perr != nil {
		p.err = perr
		final.Err = perr
		m.failed[name] = perr
		m.metrics.pulls.WithLabelValues(string(perr.Kind)).Inc()
	} else {
		delete(m.failed, name)
		m.images[name] = &entry{lastUsed: m.cfg.Clock.Now(), access: access}
		m.metrics.pulls.WithLabelValues("ok").Inc()
		m.metrics.pullSeconds.Observe(elapsed.Seconds())
		m.metrics.pullBytes.Add(float64(final.BytesDone))
	}
	close(p.done)
	m.mu.Unlock()
	m.cfg.OnProgress(final)
	if perr == nil {
		m.cfg.Logger.Info("image ready", "image", name, "access", access, "bytes", final.BytesTotal, "seconds", elapsed.Seconds())
		m.cfg.OnChange()
		m.kick(m.wakeGC)
	} else {
		m.cfg.Logger.Warn("image pull failed", "image", name, "kind", perr.Kind, "err", perr.Err)
	}
}

// pullOnce pulls and unpacks name, reporting progress as it goes. usedCreds
// says whether the registry asked for credentials and was given some.
func (m *Manager) pullOnce(ctx context.Context, name string, p *pull, creds map[string][2]string) (_ ctrd.Image, usedCreds bool, _ error) {
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tr := newTracker(m.cfg.Client.ContentStore())
	go func() {
		t := time.NewTicker(m.cfg.ProgressInterval)
		defer t.Stop()
		for {
			select {
			case <-pctx.Done():
				return
			case <-t.C:
			}
			done, total := tr.progress(pctx)
			m.mu.Lock()
			p.progress.BytesDone, p.progress.BytesTotal = done, total
			prog := p.progress
			m.mu.Unlock()
			m.cfg.OnProgress(prog)
		}
	}()
	var used atomic.Bool
	plan := m.lazySource(pctx, name, creds)
	ref := plan.pull
	resolver := m.resolver(pctx, creds, &used)
	if ref != name {
		// The pool's conversion, read with the pool's credentials: the
		// image is public (lazySource), the pod's credentials play no part.
		resolver = m.newResolver(pctx, m.convertCreds(), nil, nil)
	}
	opts := []ctrd.RemoteOpt{ctrd.WithPullUnpack, ctrd.WithPullSnapshotter(m.cfg.Snapshotter),
		ctrd.WithResolver(resolver),
		ctrd.WithImageHandler(tr.handler())}
	if m.cfg.LazyPull {
		opts = append(opts, ctrd.WithImageHandlerWrapper(snapshotters.AppendInfoHandlerWrapper(ref)))
	}
	img, err := m.cfg.Client.Pull(pctx, ref, opts...)
	cancel()
	done, total := tr.progress(ctx)
	m.mu.Lock()
	p.progress.BytesDone, p.progress.BytesTotal = done, total
	m.mu.Unlock()
	if err != nil {
		return nil, false, err
	}
	// Pull returns once content is fetched and layers are unpacked; check,
	// so that a half-unpacked image is never handed out.
	if ok, err := img.IsUnpacked(ctx, m.cfg.Snapshotter); err != nil || !ok {
		return nil, false, fmt.Errorf("image %s is not unpacked after its pull (%v)", ref, err)
	}
	if ref != name {
		if img, err = m.adoptConversion(ctx, name, plan.from, img); err != nil {
			return nil, false, err
		}
		m.cfg.Logger.Info("image started from the pool's lazy conversion", "image", name, "conversion", ref)
	} else if plan.convert {
		// Named after what was pulled; public only if the registry serves
		// that digest anonymously (convertPulled checks).
		m.startConversion(name, img, used.Load())
	}
	return img, used.Load(), nil
}

// resolver talks to registries with creds (host → user, password; a pod's
// pull secrets) and the per-registry settings of HostsDir. used, when not
// nil, is set once a registry asked for credentials and got some.
func (m *Manager) resolver(ctx context.Context, creds map[string][2]string, used *atomic.Bool) remotes.Resolver {
	return m.newResolver(ctx, creds, used, nil)
}

// Resolver talks to registries as the node's pulls do (the per-registry
// settings of HostsDir: mirrors, plain HTTP, CA files), with the
// credentials of secrets (docker config JSON documents; none: anonymous).
// tracker, when not nil, follows pushes (bytes sent per descriptor). The
// containerd runtime pushes snapshots with it.
func (m *Manager) Resolver(ctx context.Context, secrets [][]byte, tracker docker.StatusTracker) remotes.Resolver {
	return m.newResolver(ctx, parseDockerConfigs(secrets), nil, tracker)
}

func (m *Manager) newResolver(ctx context.Context, creds map[string][2]string, used *atomic.Bool, tracker docker.StatusTracker) remotes.Resolver {
	return docker.NewResolver(docker.ResolverOptions{Hosts: m.newHostsUsed(ctx, creds, used), Tracker: tracker})
}

// newHosts gives the registry hosts of a registry name: the node's
// settings (HostsDir) with creds.
func (m *Manager) newHosts(ctx context.Context, creds map[string][2]string) docker.RegistryHosts {
	return m.newHostsUsed(ctx, creds, nil)
}

func (m *Manager) newHostsUsed(ctx context.Context, creds map[string][2]string, used *atomic.Bool) docker.RegistryHosts {
	opts := config.HostOptions{
		Credentials: func(host string) (string, string, error) {
			c := creds[host]
			if used != nil && (c[0] != "" || c[1] != "") {
				used.Store(true)
			}
			return c[0], c[1], nil
		},
	}
	if m.cfg.HostsDir != "" {
		opts.HostDir = config.HostDirFromRoot(m.cfg.HostsDir)
	}
	return config.ConfigureHosts(ctx, opts)
}

// Adopt makes ref, an image the node made itself (a snapshot of a
// sandbox, recorded and unpacked into the snapshotter by the caller), an
// ordinary image of the cache: ready for binds without a pull, in the
// ready set (OnChange), measured and collected like the others. Its access
// is not known: the first pod that wants it has the registry asked once
// (see Authorize), so an image made from a private one is not handed out
// freely. An image of that name the cache held before is replaced.
func (m *Manager) Adopt(ctx context.Context, ref string) error {
	name, err := Normalize(ref)
	if err != nil {
		return err
	}
	ctx = m.ns(ctx)
	img, err := m.cfg.Client.GetImage(ctx, name)
	if err != nil {
		return classify(name, err)
	}
	if ok, err := img.IsUnpacked(ctx, m.cfg.Snapshotter); err != nil || !ok {
		return &Error{Image: name, Kind: KindFailed, Err: fmt.Errorf("not unpacked into %s (%v)", m.cfg.Snapshotter, err)}
	}
	m.mu.Lock()
	delete(m.failed, name)
	m.images[name] = &entry{lastUsed: m.cfg.Clock.Now(), access: AccessUnknown}
	m.mu.Unlock()
	m.cfg.Logger.Info("image adopted", "image", name, "digest", img.Target().Digest)
	m.cfg.OnChange()
	m.kick(m.wakeGC)
	return nil
}

// Ready returns the images unpacked on this node, sorted.
func (m *Manager) Ready() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.images))
	for name := range m.images {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// Statuses lists every image the node holds, pulls, failed to pull, or
// keeps pinned.
func (m *Manager) Statuses(ctx context.Context) []runtime.ImageStatus {
	inUse := m.inUse(ctx)
	m.mu.Lock()
	defer m.mu.Unlock()
	byName := map[string]*runtime.ImageStatus{}
	get := func(name string) *runtime.ImageStatus {
		s, ok := byName[name]
		if !ok {
			s = &runtime.ImageStatus{Image: name, State: runtime.ImagePending, Pinned: m.pinned[name], InUse: inUse[name]}
			byName[name] = s
		}
		return s
	}
	for name, e := range m.images {
		s := get(name)
		s.State, s.SizeBytes, s.LastUsed = runtime.ImageReady, e.size, e.lastUsed
	}
	for name, err := range m.failed {
		s := get(name)
		s.State, s.Error, s.ErrorKind = runtime.ImageFailed, err.Error(), string(err.Kind)
	}
	for name, p := range m.pulls {
		s := get(name)
		s.State, s.BytesDone, s.BytesTotal, s.Error, s.ErrorKind = runtime.ImagePulling, p.progress.BytesDone, p.progress.BytesTotal, "", ""
	}
	for name := range m.pinned {
		get(name)
	}
	out := make([]runtime.ImageStatus, 0, len(byName))
	for _, s := range byName {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b runtime.ImageStatus) int { return strings.Compare(a.Image, b.Image) })
	return out
}

// Pin adds images to the pre-pull set: they are pulled in the background
// (PrePullConcurrency at a time) and never collected.
func (m *Manager) Pin(refs ...string) error {
	names := make([]string, 0, len(refs))
	for _, ref := range refs {
		name, err := Normalize(ref)
		if err != nil {
			return err
		}
		names = append(names, name)
	}
	m.mu.Lock()
	for _, name := range names {
		m.pinned[name] = true
		// A new request to pre-pull retries an image that failed before.
		delete(m.failed, name)
	}
	m.mu.Unlock()
	m.kick(m.wakePrePull)
	return nil
}

// Unpin removes images from the pre-pull set; they stay cached until GC
// needs the room.
func (m *Manager) Unpin(refs ...string) error {
	for _, ref := range refs {
		name, err := Normalize(ref)
		if err != nil {
			return err
		}
		m.mu.Lock()
		delete(m.pinned, name)
		m.mu.Unlock()
	}
	return nil
}

func (m *Manager) kick(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// Run pre-pulls pinned images and keeps the cache within budget until ctx
// ends. When it returns, no pull runs and none starts (Ensure fails with
// Unavailable).
func (m *Manager) Run(ctx context.Context) {
	ctx = m.ns(ctx)
	defer func() {
		m.mu.Lock()
		m.stopped = true
		m.mu.Unlock()
		m.cancel()
		m.wg.Wait()
	}()
	m.kick(m.wakePrePull)
	m.kick(m.wakeGC)
	m.wg.Go(func() { m.prePullLoop(ctx) })
	t := time.NewTicker(m.cfg.GCInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-m.wakeGC:
		}
		if _, err := m.GC(ctx); err != nil && ctx.Err() == nil {
			m.cfg.Logger.Warn("image gc", "err", err)
		}
	}
}

// prePullLoop pulls pinned images that are not ready, a bounded number at a
// time; a failed pre-pull is tried again every minute.
func (m *Manager) prePullLoop(ctx context.Context) {
	sem := make(chan struct{}, m.cfg.PrePullConcurrency)
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	var (
		mu      sync.Mutex
		started = map[string]bool{}
	)
	for {
		retryFailed := false
		select {
		case <-ctx.Done():
			return
		case <-m.wakePrePull:
		case <-t.C:
			retryFailed = true
		}
		m.mu.Lock()
		var todo []string
		for name := range m.pinned {
			if _, ready := m.images[name]; !ready && (retryFailed || m.failed[name] == nil) {
				todo = append(todo, name)
			}
		}
		m.mu.Unlock()
		slices.Sort(todo)
		for _, name := range todo {
			mu.Lock()
			skip := started[name]
			started[name] = true
			mu.Unlock()
			if skip {
				continue
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			m.wg.Go(func() {
				defer func() { <-sem }()
				_, _ = m.EnsureForNode(ctx, name)
				mu.Lock()
				delete(started, name)
				mu.Unlock()
				m.kick(m.wakePrePull)
			})
		}
	}
}

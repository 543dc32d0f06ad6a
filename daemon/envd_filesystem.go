package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sandman-dev/sandman/daemon/envd/spec/filesystem"
	"github.com/sandman-dev/sandman/daemon/envd/spec/filesystem/filesystemconnect"
	"github.com/sandman-dev/sandman/daemon/internal/sandboxuser"
)

// Limits of the filesystem service.
const (
	// envdMaxWatchers caps directory watches alive at once: WatchDir
	// streams and polling watchers together (each holds an inotify
	// instance, of which the kernel allows a user 128 by default).
	envdMaxWatchers = 64
	// envdMaxWatcherEvents caps the events a polling watcher keeps between
	// two GetWatcherEvents calls.
	envdMaxWatcherEvents = 10000
	// envdWatcherIdle is how long a polling watcher may go unpolled before
	// a new watch that finds no free place may reclaim it.
	envdWatcherIdle = 10 * time.Minute
	// envdMaxListEntries caps the entries of one ListDir.
	envdMaxListEntries = 100000
	// envdKeepalive is the WatchDir keepalive interval when the client
	// names none (the SDKs send Keepalive-Ping-Interval: 50).
	envdKeepalive = 50 * time.Second
)

// envdFilesystem serves envd's filesystem service. Paths are absolute or
// relative to the caller's base directory (see sandboxuser.User.Resolve); a call
// that names a user acts with that user's credentials (sandboxuser.User.Do), so
// the kernel checks its permissions and what it creates is the user's;
// directory watches use inotify through fsnotify, streamed (WatchDir) or
// collected for polling (CreateWatcher). Watchers live in memory and end
// with the daemon.
type envdFilesystem struct {
	filesystemconnect.UnimplementedFilesystemHandler
	s *Server

	// watchMu guards watchers and open.
	watchMu sync.Mutex
	// watchers are the polling watchers by id (nil until the first).
	watchers map[string]*envdPollWatcher
	// open counts the other places taken: WatchDir streams, and polling
	// watchers being created.
	open int
}

var _ filesystemconnect.FilesystemHandler = (*envdFilesystem)(nil)

// mkdirAll creates dir and its missing parents and returns the
// directories it made (outermost first). On an error it removes what it
// made. Run through do, what it makes is the caller's.
func mkdirAll(dir string) (made []string, retErr error) {
	defer func() {
		if retErr != nil {
			for i := len(made) - 1; i >= 0; i-- {
				_ = os.Remove(made[i])
			}
			made = nil
		}
	}()
	var todo []string
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err == nil {
			if !fi.IsDir() {
				return nil, &fs.PathError{Op: "mkdir", Path: p, Err: syscall.ENOTDIR}
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		todo = append(todo, p)
		if p == "/" || p == "." {
			break
		}
	}
	for i := len(todo) - 1; i >= 0; i-- {
		p := todo[i]
		if err := os.Mkdir(p, 0o755); err != nil {
			if fi, serr := os.Stat(p); errors.Is(err, fs.ErrExist) && serr == nil && fi.IsDir() {
				continue // made meanwhile by someone else
			}
			return made, err
		}
		made = append(made, p)
	}
	return made, nil
}

// envdUserFor is the user an envd call names ("" for the default), with
// the sandbox's environment and directory.
func (s *Server) envdUserFor(name string) (*sandboxuser.User, error) {
	a := s.access.Load()
	return sandboxuser.For(name, a.env, a.dir)
}

// user resolves the user of a filesystem call.
func (f *envdFilesystem) user(ctx context.Context) (*sandboxuser.User, error) {
	u, err := f.s.envdUserFor(envdUser(ctx))
	if err != nil {
		return u, asConnectError(err)
	}
	return u, nil
}

// path is the caller's user and p resolved for them.
func (f *envdFilesystem) path(ctx context.Context, p string) (*sandboxuser.User, string, error) {
	u, err := f.user(ctx)
	if err != nil {
		return u, "", err
	}
	p, err = u.Resolve(p)
	return u, p, asConnectError(err)
}

// entry describes p, whose Lstat is fi, as envd does: a symbolic link
// carries its resolved target and the type and permission bits of what it
// leads to (a dangling link stays a symlink).
func entryInfo(n *sandboxuser.Names, p string, fi fs.FileInfo) *filesystem.EntryInfo {
	mode := fi.Mode()
	e := &filesystem.EntryInfo{
		Name:         fi.Name(),
		Path:         p,
		Size:         fi.Size(),
		Permissions:  mode.String(),
		ModifiedTime: timestamppb.New(fi.ModTime()),
		Type:         envdFileType(mode),
		Mode:         unixPerm(mode),
	}
	if p == "/" {
		e.Name = "/"
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner = n.User(st.Uid)
		e.Group = n.Group(st.Gid)
	}
	if mode&fs.ModeSymlink != 0 {
		target, err := filepath.EvalSymlinks(p)
		tfi, serr := os.Stat(p)
		if err == nil && serr == nil {
			e.Type = envdFileType(tfi.Mode())
			e.Mode = unixPerm(tfi.Mode())
		} else if target, err = os.Readlink(p); err != nil {
			target = ""
		}
		e.SymlinkTarget = &target
	}
	return e
}

func envdFileType(m fs.FileMode) filesystem.FileType {
	switch {
	case m.IsRegular():
		return filesystem.FileType_FILE_TYPE_FILE
	case m.IsDir():
		return filesystem.FileType_FILE_TYPE_DIRECTORY
	case m&fs.ModeSymlink != 0:
		return filesystem.FileType_FILE_TYPE_SYMLINK
	}
	return filesystem.FileType_FILE_TYPE_UNSPECIFIED // devices, FIFOs, sockets: as envd
}

// unixPerm is the permission bits of m as stat(2) gives them, setuid,
// setgid and sticky included.
func unixPerm(m fs.FileMode) uint32 {
	p := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		p |= syscall.S_ISUID
	}
	if m&fs.ModeSetgid != 0 {
		p |= syscall.S_ISGID
	}
	if m&fs.ModeSticky != 0 {
		p |= syscall.S_ISVTX
	}
	return p
}

// stat describes p (not following a final symbolic link).
func statEntry(n *sandboxuser.Names, p string) (*filesystem.EntryInfo, error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, err
	}
	return entryInfo(n, p, fi), nil
}

func (f *envdFilesystem) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	u, p, err := f.path(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	names := sandboxuser.NewNames()
	var e *filesystem.EntryInfo
	if err := u.Do(func() (err error) {
		e, err = statEntry(names, p)
		return err
	}); err != nil {
		return nil, asConnectError(err)
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: e}), nil
}

// MakeDir creates a directory and its missing parents, all owned by the
// caller; AlreadyExists if the directory is there (the SDKs' makeDir then
// answers false).
func (f *envdFilesystem) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	u, p, err := f.path(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	names := sandboxuser.NewNames()
	var e *filesystem.EntryInfo
	if err := u.Do(func() error {
		if fi, err := os.Stat(p); err == nil {
			if fi.IsDir() {
				return connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %s already exists", p))
			}
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%s already exists and is not a directory", p))
		}
		if _, err := mkdirAll(p); err != nil {
			return err
		}
		e, err = statEntry(names, p)
		return err
	}); err != nil {
		return nil, asConnectError(err)
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: e}), nil
}

// Move renames source to destination (rename(2): a file or an empty
// directory there is replaced), creating the destination's missing parents
// for the caller.
func (f *envdFilesystem) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	u, err := f.user(ctx)
	if err != nil {
		return nil, err
	}
	if req.Msg.GetSource() == "" || req.Msg.GetDestination() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("source and destination are both required"))
	}
	src, err := u.Resolve(req.Msg.GetSource())
	if err != nil {
		return nil, asConnectError(err)
	}
	dst, err := u.Resolve(req.Msg.GetDestination())
	if err != nil {
		return nil, asConnectError(err)
	}
	names := sandboxuser.NewNames()
	var e *filesystem.EntryInfo
	if err := u.Do(func() error {
		if _, err := os.Lstat(src); err != nil {
			return fmt.Errorf("source: %w", err)
		}
		made, err := mkdirAll(filepath.Dir(dst))
		if err != nil {
			return err
		}
		if err := os.Rename(src, dst); err != nil {
			undoDirs(made)
			if errors.Is(err, syscall.EINVAL) {
				return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%w: cannot move a directory into itself", err))
			}
			if errors.Is(err, syscall.EEXIST) || errors.Is(err, syscall.ENOTEMPTY) {
				return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%w: the destination is a directory that is not empty", err))
			}
			return err
		}
		e, err = statEntry(names, dst)
		return err
	}); err != nil {
		return nil, asConnectError(err)
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: e}), nil
}

func (f *envdFilesystem) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	u, p, err := f.path(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.GetDepth())
	if depth <= 0 {
		depth = 1 // the SDKs send 1 by default; envd reads 0 as 1
	}
	l := envdLister{names: sandboxuser.NewNames(), entries: []*filesystem.EntryInfo{}}
	if err := u.Do(func() error {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%s is not a directory", p))
		}
		return l.walk(ctx, p, depth)
	}); err != nil {
		return nil, asConnectError(err)
	}
	return connect.NewResponse(&filesystem.ListDirResponse{Entries: l.entries}), nil
}

// envdLister collects the entries of a tree.
type envdLister struct {
	names   *sandboxuser.Names
	entries []*filesystem.EntryInfo
}

// walk lists dir and, depth > 1, the directories under it (never
// following links), in name order. Subdirectories it cannot read are
// listed without their contents.
func (l *envdLister) walk(ctx context.Context, dir string, depth int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	des, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, d := range des {
		if len(l.entries) >= envdMaxListEntries {
			return connect.NewError(connect.CodeResourceExhausted,
				fmt.Errorf("more than %d entries: list with a smaller depth, or a subdirectory", envdMaxListEntries))
		}
		q := filepath.Join(dir, d.Name())
		fi, err := d.Info()
		if err != nil {
			continue // gone meanwhile
		}
		l.entries = append(l.entries, entryInfo(l.names, q, fi))
		if depth > 1 && d.IsDir() {
			if err := l.walk(ctx, q, depth-1); err != nil {
				var ce *connect.Error
				if errors.As(err, &ce) || ctx.Err() != nil {
					return err
				}
			}
		}
	}
	return nil
}

// Remove removes a file, a link or a directory with everything in it; a
// path that does not exist is not an error (rm -rf, as envd).
func (f *envdFilesystem) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	u, err := f.user(ctx)
	if err != nil {
		return nil, err
	}
	if req.Msg.GetPath() == "" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("path is required"))
	}
	p, err := u.Resolve(req.Msg.GetPath())
	if err != nil {
		return nil, asConnectError(err)
	}
	if p == "/" {
		return nil, connect.NewError(connect.CodeInvalidArgument, errors.New("refusing to remove /"))
	}
	if err := u.Do(func() error { return os.RemoveAll(p) }); err != nil {
		return nil, asConnectError(err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

// Network filesystems, where inotify sees only this machine's changes
// (the kernel's magic numbers, as envd lists them).
var envdNetworkFS = map[int64]bool{0x6969: true, 0xFF534D42: true, 0x517B: true, 0xFE534D42: true, 0x65735546: true}

// watchTarget resolves and checks the directory of a watch, and returns
// the user the watch acts as.
func (f *envdFilesystem) watchTarget(ctx context.Context, path string, allowNetwork bool) (*sandboxuser.User, string, error) {
	u, p, err := f.path(ctx, path)
	if err != nil {
		return u, "", err
	}
	err = u.Do(func() error {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%s is not a directory: watch the directory that holds it", p))
		}
		var st unix.Statfs_t
		if err := unix.Statfs(p, &st); err == nil && envdNetworkFS[int64(st.Type)] && !allowNetwork {
			return connect.NewError(connect.CodeInvalidArgument,
				fmt.Errorf("%s is on a network filesystem, where a watch sees only this sandbox's changes: set allowNetworkMounts to watch it anyway", p))
		}
		return nil
	})
	return u, p, asConnectError(err)
}

// acquireWatch takes a place for a new watch, reclaiming polling watchers
// left unpolled for envdWatcherIdle if none is free; releaseWatch gives it
// back.
func (f *envdFilesystem) acquireWatch() error {
	var reclaimed []*envdPollWatcher
	defer func() {
		for _, w := range reclaimed {
			w.close()
		}
	}()
	f.watchMu.Lock()
	defer f.watchMu.Unlock()
	if f.open+len(f.watchers) >= envdMaxWatchers {
		now := f.s.cfg.Now()
		for id, w := range f.watchers {
			if now.Sub(w.lastPolled()) >= envdWatcherIdle {
				delete(f.watchers, id)
				reclaimed = append(reclaimed, w)
			}
		}
	}
	if f.open+len(f.watchers) >= envdMaxWatchers {
		return connect.NewError(connect.CodeResourceExhausted,
			fmt.Errorf("%d directory watches are open in this sandbox (the daemon's limit): stop some (end a watchDir, RemoveWatcher)", envdMaxWatchers))
	}
	f.open++
	return nil
}

func (f *envdFilesystem) releaseWatch() {
	f.watchMu.Lock()
	f.open--
	f.watchMu.Unlock()
}

// WatchDir streams the changes under a directory: a start event once the
// watch is in place, then filesystem events, and keepalives when nothing
// happens (at the client's Keepalive-Ping-Interval, in seconds).
func (f *envdFilesystem) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	u, root, err := f.watchTarget(ctx, req.Msg.GetPath(), req.Msg.GetAllowNetworkMounts())
	if err != nil {
		return err
	}
	if err := f.acquireWatch(); err != nil {
		return err
	}
	defer f.releaseWatch()

	w, err := newEnvdWatch(u, root, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return err
	}
	defer w.close()
	if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	every := watchKeepalive(req.Header().Get("Keepalive-Ping-Interval"))
	keepalive := time.NewTimer(every)
	defer keepalive.Stop()
	var sendErr error
	emit := func(ev *filesystem.FilesystemEvent) {
		if sendErr == nil {
			sendErr = stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: ev}})
		}
	}
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-keepalive.C:
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
			keepalive.Reset(every)
		case err, ok := <-w.fw.Errors:
			if !ok {
				return nil
			}
			return w.failure(err)
		case e, ok := <-w.fw.Events:
			if !ok {
				return nil
			}
			evs, end := w.handle(e)
			for _, ev := range evs {
				emit(ev)
			}
			if sendErr != nil {
				return sendErr
			}
			if end != nil {
				return end
			}
			keepalive.Reset(every)
		}
	}
}

// watchKeepalive reads a Keepalive-Ping-Interval header (seconds).
func watchKeepalive(v string) time.Duration {
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil || n <= 0 {
		return envdKeepalive
	}
	return time.Duration(min(n, 3600)) * time.Second
}

// envdWatch is an inotify watch on a directory and, recursive, on every
// directory under it (fsnotify watches one directory; new directories are
// added as they appear, and what they already hold is reported as
// created). The directories it adds and the entries it describes are
// those its user may read. It is driven by one goroutine: the one reading
// fw's channels.
type envdWatch struct {
	as           *sandboxuser.User
	root         string
	recursive    bool
	includeEntry bool
	fw           *fsnotify.Watcher
	names        *sandboxuser.Names
	// dirs are the directories watched, the root included.
	dirs map[string]struct{}
}

func newEnvdWatch(as *sandboxuser.User, root string, recursive, includeEntry bool) (_ *envdWatch, retErr error) {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, watchAddError(root, err)
	}
	w := &envdWatch{as: as, root: root, recursive: recursive, includeEntry: includeEntry, fw: fw, dirs: map[string]struct{}{}}
	defer func() {
		if retErr != nil {
			_ = fw.Close()
		}
	}()
	if includeEntry {
		w.names = sandboxuser.NewNames()
	}
	if err := w.as.Do(func() error { return w.add(root, nil) }); err != nil {
		return nil, asConnectError(err)
	}
	return w, nil
}

func (w *envdWatch) close() { _ = w.fw.Close() }

// add watches dir and, recursive, the directories under it. announce, if
// set, receives a create event for each entry found under dir. It runs
// through w.as.do.
func (w *envdWatch) add(dir string, announce func(*filesystem.FilesystemEvent)) error {
	if err := w.fw.Add(dir); err != nil {
		return watchAddError(dir, err)
	}
	w.dirs[dir] = struct{}{}
	if !w.recursive {
		return nil
	}
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil // gone or unreadable: nothing under it to watch
	}
	for _, d := range des {
		q := filepath.Join(dir, d.Name())
		if announce != nil {
			announce(w.event(q, filesystem.EventType_EVENT_TYPE_CREATE))
		}
		if d.IsDir() {
			if err := w.add(q, announce); err != nil && !skippableWatchError(err) {
				return err
			}
		}
	}
	return nil
}

// skippableWatchError reports whether a directory under a recursive
// watch's root is left out rather than ending the watch: it went away
// meanwhile, or the watch's user may not read it (as ListDir lists such a
// directory without its contents).
func skippableWatchError(err error) bool {
	var ce *connect.Error
	if errors.As(err, &ce) && (ce.Code() == connect.CodeNotFound || ce.Code() == connect.CodePermissionDenied) {
		return true
	}
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission)
}

// watchAddError explains a failure to set up a watch.
func watchAddError(dir string, err error) error {
	switch {
	case errors.Is(err, syscall.ENOSPC):
		return connect.NewError(connect.CodeResourceExhausted,
			fmt.Errorf("watch %s: the sandbox's inotify watches are used up (fs.inotify.max_user_watches): watch a smaller tree, or non-recursively", dir))
	case errors.Is(err, syscall.EMFILE):
		return connect.NewError(connect.CodeResourceExhausted,
			fmt.Errorf("watch %s: the sandbox's inotify instances are used up (fs.inotify.max_user_instances): stop other watches", dir))
	case errors.Is(err, fs.ErrNotExist):
		return connect.NewError(connect.CodeNotFound, fmt.Errorf("watch %s: %w", dir, err))
	}
	return asConnectError(fmt.Errorf("watch %s: %w", dir, err))
}

// failure is the error that ends a watch after fsnotify reports err.
func (w *envdWatch) failure(err error) error {
	if errors.Is(err, fsnotify.ErrEventOverflow) {
		return connect.NewError(connect.CodeResourceExhausted,
			fmt.Errorf("watch %s: the kernel dropped events (inotify queue overflow); start a new watch and re-read the directory", w.root))
	}
	return connect.NewError(connect.CodeInternal, fmt.Errorf("watch %s: %w", w.root, err))
}

// event is a filesystem event for path p.
func (w *envdWatch) event(p string, t filesystem.EventType) *filesystem.FilesystemEvent {
	name, err := filepath.Rel(w.root, p)
	if err != nil {
		name = p
	}
	ev := &filesystem.FilesystemEvent{Name: name, Type: t}
	if w.includeEntry {
		w.names.Refresh()
		if e, err := statEntry(w.names, p); err == nil {
			ev.Entry = e
		}
	}
	return ev
}

// handle turns one fsnotify event into envd's events (one per operation
// it carries, in envd's order) and keeps the recursive watch in step: a
// new directory is watched before its creation is reported, so a client
// that writes into it once it sees the event is seen writing. It returns
// an error when the watch cannot go on: its root went away.
func (w *envdWatch) handle(e fsnotify.Event) (evs []*filesystem.FilesystemEvent, end error) {
	err := w.as.Do(func() error {
		evs, end = w.handleAs(e)
		return nil
	})
	if err != nil {
		return nil, asConnectError(err)
	}
	return evs, end
}

// handleAs is handle's work, run with the watch's user's credentials.
func (w *envdWatch) handleAs(e fsnotify.Event) ([]*filesystem.FilesystemEvent, error) {
	var evs, found []*filesystem.FilesystemEvent
	emit := func(ev *filesystem.FilesystemEvent) { evs = append(evs, ev) }
	if w.recursive && e.Has(fsnotify.Create) {
		if fi, err := os.Lstat(e.Name); err == nil && fi.IsDir() {
			err := w.add(e.Name, func(ev *filesystem.FilesystemEvent) { found = append(found, ev) })
			if err != nil && !skippableWatchError(err) {
				return evs, err
			}
		}
	}
	for _, op := range []struct {
		op fsnotify.Op
		t  filesystem.EventType
	}{
		{fsnotify.Create, filesystem.EventType_EVENT_TYPE_CREATE},
		{fsnotify.Rename, filesystem.EventType_EVENT_TYPE_RENAME},
		{fsnotify.Chmod, filesystem.EventType_EVENT_TYPE_CHMOD},
		{fsnotify.Write, filesystem.EventType_EVENT_TYPE_WRITE},
		{fsnotify.Remove, filesystem.EventType_EVENT_TYPE_REMOVE},
	} {
		if e.Has(op.op) {
			emit(w.event(e.Name, op.t))
		}
	}
	evs = append(evs, found...)
	if e.Name == w.root && (e.Has(fsnotify.Remove) || e.Has(fsnotify.Rename)) {
		return evs, connect.NewError(connect.CodeNotFound, fmt.Errorf("the watched directory %s was removed or moved", w.root))
	}
	if w.recursive && (e.Has(fsnotify.Remove) || e.Has(fsnotify.Rename)) {
		w.forget(e.Name)
	}
	return evs, nil
}

// forget drops the watches of a directory that went away and of those
// under it (a moved directory keeps its inotify watches, which would go on
// reporting under the old names).
func (w *envdWatch) forget(dir string) {
	if _, ok := w.dirs[dir]; !ok {
		return
	}
	for d := range w.dirs {
		if d == dir || strings.HasPrefix(d, dir+"/") {
			delete(w.dirs, d)
			_ = w.fw.Remove(d)
		}
	}
}

// envdPollWatcher collects a watch's events until they are polled.
type envdPollWatcher struct {
	id    string
	watch *envdWatch
	// done is closed when the collecting goroutine has returned.
	done chan struct{}

	// mu guards the fields below.
	mu     sync.Mutex
	events []*filesystem.FilesystemEvent
	// err ended the watch; it is reported once the events before it are.
	err    error
	polled time.Time
}

func (p *envdPollWatcher) lastPolled() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.polled
}

// run collects events until the watch ends.
func (p *envdPollWatcher) run() {
	defer close(p.done)
	emit := func(ev *filesystem.FilesystemEvent) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.err != nil {
			return
		}
		if len(p.events) >= envdMaxWatcherEvents {
			p.err = connect.NewError(connect.CodeResourceExhausted,
				fmt.Errorf("watcher %s: more than %d events since the last GetWatcherEvents, later ones were dropped: poll more often, then remove this watcher and create a new one", p.id, envdMaxWatcherEvents))
			return
		}
		p.events = append(p.events, ev)
	}
	fail := func(err error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.err == nil {
			p.err = err
		}
	}
	for {
		select {
		case err, ok := <-p.watch.fw.Errors:
			if !ok {
				return
			}
			fail(p.watch.failure(err))
			p.watch.close()
		case e, ok := <-p.watch.fw.Events:
			if !ok {
				return
			}
			evs, err := p.watch.handle(e)
			for _, ev := range evs {
				emit(ev)
			}
			if err != nil {
				fail(err)
				p.watch.close()
			}
		}
	}
}

// close ends the watch and waits for the collecting goroutine.
func (p *envdPollWatcher) close() {
	p.watch.close()
	<-p.done
}

// CreateWatcher starts a watch whose events GetWatcherEvents returns.
func (f *envdFilesystem) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	u, root, err := f.watchTarget(ctx, req.Msg.GetPath(), req.Msg.GetAllowNetworkMounts())
	if err != nil {
		return nil, err
	}
	if err := f.acquireWatch(); err != nil {
		return nil, err
	}
	w, err := newEnvdWatch(u, root, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		f.releaseWatch()
		return nil, err
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	p := &envdPollWatcher{id: "w" + hex.EncodeToString(b[:]), watch: w, done: make(chan struct{}), polled: f.s.cfg.Now()}
	go p.run()
	f.watchMu.Lock()
	if f.watchers == nil {
		f.watchers = map[string]*envdPollWatcher{}
	}
	f.watchers[p.id] = p
	f.open--
	f.watchMu.Unlock()
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: p.id}), nil
}

func (f *envdFilesystem) watcher(id string) (*envdPollWatcher, error) {
	f.watchMu.Lock()
	defer f.watchMu.Unlock()
	p, ok := f.watchers[id]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found (removed, reclaimed after %v unpolled, or from before the daemon restarted)", id, envdWatcherIdle))
	}
	return p, nil
}

// GetWatcherEvents returns the events since the last call; once the watch
// has failed, the error, after the events before it.
func (f *envdFilesystem) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	p, err := f.watcher(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.polled = f.s.cfg.Now()
	if len(p.events) == 0 && p.err != nil {
		return nil, p.err
	}
	events := p.events
	p.events = nil
	if events == nil {
		events = []*filesystem.FilesystemEvent{}
	}
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: events}), nil
}

func (f *envdFilesystem) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	id := req.Msg.GetWatcherId()
	f.watchMu.Lock()
	p, ok := f.watchers[id]
	delete(f.watchers, id)
	f.watchMu.Unlock()
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", id))
	}
	p.close()
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}

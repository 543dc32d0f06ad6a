package envd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/fsnotify/fsnotify"
	"golang.org/x/sys/unix"

	"github.com/sandman-dev/sandman/daemon/envd/spec/filesystem"
	"github.com/sandman-dev/sandman/daemon/internal/sandboxuser"
)

// Network filesystems, where inotify sees only this machine's changes
// (the kernel's magic numbers, as envd lists them).
var networkFS = map[int64]bool{0x6969: true, 0xFF534D42: true, 0x517B: true, 0xFE534D42: true, 0x65735546: true}

// watchTarget resolves and checks the directory of a watch, and returns
// the user the watch acts as.
func (f *filesystemService) watchTarget(ctx context.Context, path string, allowNetwork bool) (*sandboxuser.User, string, error) {
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
		if err := unix.Statfs(p, &st); err == nil && networkFS[int64(st.Type)] && !allowNetwork {
			return connect.NewError(connect.CodeInvalidArgument,
				fmt.Errorf("%s is on a network filesystem, where a watch sees only this sandbox's changes: set allowNetworkMounts to watch it anyway", p))
		}
		return nil
	})
	return u, p, asConnectError(err)
}

// acquireWatch takes a place for a new watch, reclaiming polling watchers
// left unpolled for watcherIdle if none is free; releaseWatch gives it
// back.
func (f *filesystemService) acquireWatch() error {
	var reclaimed []*pollWatcher
	defer func() {
		for _, w := range reclaimed {
			w.close()
		}
	}()
	f.watchMu.Lock()
	defer f.watchMu.Unlock()
	if f.open+len(f.watchers) >= maxWatchers {
		now := f.s.cfg.Now()
		for id, w := range f.watchers {
			if now.Sub(w.lastPolled()) >= watcherIdle {
				delete(f.watchers, id)
				reclaimed = append(reclaimed, w)
			}
		}
	}
	if f.open+len(f.watchers) >= maxWatchers {
		return connect.NewError(connect.CodeResourceExhausted,
			fmt.Errorf("%d directory watches are open in this sandbox (the daemon's limit): stop some (end a watchDir, RemoveWatcher)", maxWatchers))
	}
	f.open++
	return nil
}

func (f *filesystemService) releaseWatch() {
	f.watchMu.Lock()
	f.open--
	f.watchMu.Unlock()
}

// WatchDir streams the changes under a directory: a start event once the
// watch is in place, then filesystem events, and keepalives when nothing
// happens (at the client's Keepalive-Ping-Interval, in seconds).
func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	u, root, err := f.watchTarget(ctx, req.Msg.GetPath(), req.Msg.GetAllowNetworkMounts())
	if err != nil {
		return err
	}
	if err := f.acquireWatch(); err != nil {
		return err
	}
	defer f.releaseWatch()

	w, err := newDirWatch(u, root, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		return err
	}
	defer w.close()
	if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	every := keepaliveInterval(req.Header())
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

// dirWatch is an inotify watch on a directory and, recursive, on every
// directory under it (fsnotify watches one directory; new directories are
// added as they appear, and what they already hold is reported as
// created). The directories it adds and the entries it describes are
// those its user may read. It is driven by one goroutine: the one reading
// fw's channels.
type dirWatch struct {
	as           *sandboxuser.User
	root         string
	recursive    bool
	includeEntry bool
	fw           *fsnotify.Watcher
	names        *sandboxuser.Names
	// dirs are the directories watched, the root included.
	dirs map[string]struct{}
}

func newDirWatch(as *sandboxuser.User, root string, recursive, includeEntry bool) (_ *dirWatch, retErr error) {
	fw, err := fsnotify.NewWatcher()
	if err != nil {
		return nil, watchAddError(root, err)
	}
	w := &dirWatch{as: as, root: root, recursive: recursive, includeEntry: includeEntry, fw: fw, dirs: map[string]struct{}{}}
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

func (w *dirWatch) close() { _ = w.fw.Close() }

// add watches dir and, recursive, the directories under it. announce, if
// set, receives a create event for each entry found under dir. It runs
// through w.as.do.
func (w *dirWatch) add(dir string, announce func(*filesystem.FilesystemEvent)) error {
	// A watch needs read permission on its directory. Linux's
	// inotify_add_watch checks it; gVisor's does not, so the user opens
	// the directory first, and the watch must be on the directory opened
	// (one swapped in at the name meanwhile is not kept).
	f, err := os.Open(dir)
	if err != nil {
		return watchAddError(dir, err)
	}
	defer f.Close()
	if err := w.fw.Add(dir); err != nil {
		return watchAddError(dir, err)
	}
	opened, err1 := f.Stat()
	watched, err2 := os.Stat(dir)
	if err1 != nil || err2 != nil || !os.SameFile(opened, watched) {
		_ = w.fw.Remove(dir)
		return watchAddError(dir, fmt.Errorf("it was replaced while the watch was set up: %w", fs.ErrPermission))
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
func (w *dirWatch) failure(err error) error {
	if errors.Is(err, fsnotify.ErrEventOverflow) {
		return connect.NewError(connect.CodeResourceExhausted,
			fmt.Errorf("watch %s: the kernel dropped events (inotify queue overflow); start a new watch and re-read the directory", w.root))
	}
	return connect.NewError(connect.CodeInternal, fmt.Errorf("watch %s: %w", w.root, err))
}

// event is a filesystem event for path p.
func (w *dirWatch) event(p string, t filesystem.EventType) *filesystem.FilesystemEvent {
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
func (w *dirWatch) handle(e fsnotify.Event) (evs []*filesystem.FilesystemEvent, end error) {
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
func (w *dirWatch) handleAs(e fsnotify.Event) ([]*filesystem.FilesystemEvent, error) {
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
func (w *dirWatch) forget(dir string) {
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

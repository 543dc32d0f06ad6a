package envd

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/envd/spec/filesystem"
	"github.com/sandman-dev/sandman/daemon/envd/spec/filesystem/filesystemconnect"
	"github.com/sandman-dev/sandman/daemon/internal/sandboxuser"
)

// Limits of the filesystem service.
const (
	// maxWatchers caps directory watches alive at once: WatchDir
	// streams and polling watchers together (each holds an inotify
	// instance, of which the kernel allows a user 128 by default).
	maxWatchers = 64
	// maxWatcherEvents caps the events a polling watcher keeps between
	// two GetWatcherEvents calls.
	maxWatcherEvents = 10000
	// watcherIdle is how long a polling watcher may go unpolled before
	// a new watch that finds no free place may reclaim it.
	watcherIdle = 10 * time.Minute
	// maxListEntries caps the entries of one ListDir.
	maxListEntries = 100000
)

// filesystemService serves envd's filesystem service. Paths are absolute or
// relative to the caller's base directory (see sandboxuser.User.Resolve); a call
// that names a user acts with that user's credentials (sandboxuser.User.Do), so
// the kernel checks its permissions and what it creates is the user's;
// directory watches use inotify through fsnotify, streamed (WatchDir) or
// collected for polling (CreateWatcher). Watchers live in memory and end
// with the daemon.
type filesystemService struct {
	filesystemconnect.UnimplementedFilesystemHandler
	s *Service

	// watchMu guards watchers and open.
	watchMu sync.Mutex
	// watchers are the polling watchers by id (nil until the first).
	watchers map[string]*pollWatcher
	// open counts the other places taken: WatchDir streams, and polling
	// watchers being created.
	open int
}

var _ filesystemconnect.FilesystemHandler = (*filesystemService)(nil)

// userFor is the user an envd call names, with the sandbox's environment
// and directory. "" is the default user: the sandbox's api.EnvEnvdUser
// (E2B's default user) if set, whose relative paths start at the
// sandbox's directory as the daemon's own do, else the daemon's own.
func (s *Service) userFor(name string) (*sandboxuser.User, error) {
	env, dir := s.sandbox.Environment()
	if def := sandboxuser.Env(env, api.EnvEnvdUser); name == "" && def != "" {
		u, err := sandboxuser.Lookup(def)
		if err != nil {
			return nil, fmt.Errorf("the sandbox's default user (%s): %w", api.EnvEnvdUser, err)
		}
		u.Base = dir
		return u, nil
	}
	return sandboxuser.For(name, env, dir)
}

// user resolves the user of a filesystem call.
func (f *filesystemService) user(ctx context.Context) (*sandboxuser.User, error) {
	u, err := f.s.userFor(callUser(ctx))
	if err != nil {
		return u, asConnectError(err)
	}
	return u, nil
}

// path is the caller's user and p resolved for them.
func (f *filesystemService) path(ctx context.Context, p string) (*sandboxuser.User, string, error) {
	u, err := f.user(ctx)
	if err != nil {
		return u, "", err
	}
	p, err = u.Resolve(p)
	return u, p, asConnectError(err)
}

// entry describes p, whose Lstat is fi, as envd does: a symbolic link
// carries its resolved target and the type and permission bits of what it
// leads to (a dangling link stays a symlink); metadata is the user.e2b.*
// extended attributes of p (of what a link leads to), see metadata.go.
func entryInfo(n *sandboxuser.Names, p string, fi fs.FileInfo) *filesystem.EntryInfo {
	mode := fi.Mode()
	e := &filesystem.EntryInfo{
		Name:         fi.Name(),
		Path:         p,
		Size:         fi.Size(),
		Permissions:  mode.String(),
		ModifiedTime: timestamppb.New(fi.ModTime()),
		Type:         fileType(mode),
		Mode:         unixPerm(mode),
		Metadata:     readMetadata(p),
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
			e.Type = fileType(tfi.Mode())
			e.Mode = unixPerm(tfi.Mode())
		} else if target, err = os.Readlink(p); err != nil {
			target = ""
		}
		e.SymlinkTarget = &target
	}
	return e
}

func fileType(m fs.FileMode) filesystem.FileType {
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

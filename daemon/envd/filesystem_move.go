package envd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"connectrpc.com/connect"

	"github.com/sandman-dev/sandman/daemon/envd/spec/filesystem"
	"github.com/sandman-dev/sandman/daemon/internal/sandboxuser"
)

// Move renames source to destination (rename(2): a file or an empty
// directory there is replaced), creating the destination's missing parents
// for the caller (see sandboxuser.MkdirAll). A file keeps its metadata: it
// lives with the inode.
func (f *filesystemService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
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
	var (
		e        *filesystem.EntryInfo
		renamed  bool
		needDirs bool
		dirs     *sandboxuser.Dirs // nil: dst's directory was there
	)
	move := func() error {
		if err := os.Rename(src, dst); err != nil {
			if errors.Is(err, syscall.EINVAL) {
				return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("%w: cannot move a directory into itself", err))
			}
			if errors.Is(err, syscall.EEXIST) || errors.Is(err, syscall.ENOTEMPTY) {
				return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%w: the destination is a directory that is not empty", err))
			}
			return err
		}
		renamed = true
		var err error
		e, err = statEntry(names, dst)
		return err
	}
	// One credential switch when dst's directory is there; otherwise it
	// is made first (MkdirAll switches as it needs).
	err = u.Do(func() error {
		if _, err := os.Lstat(src); err != nil {
			return fmt.Errorf("source: %w", err)
		}
		if fi, err := os.Stat(filepath.Dir(dst)); err != nil || !fi.IsDir() {
			needDirs = true
			return nil
		}
		return move()
	})
	if err == nil && needDirs {
		if dirs, err = u.MkdirAll(filepath.Dir(dst)); err == nil {
			err = u.Do(move)
		}
	}
	if err != nil {
		if renamed {
			dirs.Keep()
		} else {
			dirs.Undo()
		}
		return nil, asConnectError(err)
	}
	dirs.Keep()
	return connect.NewResponse(&filesystem.MoveResponse{Entry: e}), nil
}

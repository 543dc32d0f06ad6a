package envd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"syscall"

	"connectrpc.com/connect"

	"github.com/sandman-dev/sandman/daemon/envd/spec/filesystem"
	"github.com/sandman-dev/sandman/daemon/internal/sandboxuser"
)

// MakeDir creates a directory and its missing parents, all owned by the
// caller (made for them where only root may, see sandboxuser.MkdirAll);
// AlreadyExists if the directory is there (the SDKs' makeDir then answers
// false).
func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	u, p, err := f.path(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	dirs, err := u.MkdirAll(p)
	if err != nil {
		var pe *fs.PathError
		if errors.Is(err, syscall.ENOTDIR) && errors.As(err, &pe) && pe.Path == p {
			return nil, connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("%s already exists and is not a directory", p))
		}
		return nil, asConnectError(err)
	}
	m := dirs.Made()
	made := len(m) > 0 && m[len(m)-1] == p
	dirs.Keep()
	if !made {
		return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory %s already exists", p))
	}
	names := sandboxuser.NewNames()
	var e *filesystem.EntryInfo
	if err := u.Do(func() (err error) {
		e, err = statEntry(names, p)
		return err
	}); err != nil {
		return nil, asConnectError(err)
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: e}), nil
}

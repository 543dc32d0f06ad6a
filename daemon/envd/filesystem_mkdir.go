package envd

import (
	"context"
	"fmt"
	"os"

	"connectrpc.com/connect"

	"github.com/sandman-dev/sandman/daemon/envd/spec/filesystem"
	"github.com/sandman-dev/sandman/daemon/internal/sandboxuser"
)

// MakeDir creates a directory and its missing parents, all owned by the
// caller; AlreadyExists if the directory is there (the SDKs' makeDir then
// answers false).
func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
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

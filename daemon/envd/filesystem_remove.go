package envd

import (
	"context"
	"errors"
	"os"

	"connectrpc.com/connect"

	"github.com/sandman-dev/sandman/daemon/envd/spec/filesystem"
)

// Remove removes a file, a link or a directory with everything in it; a
// path that does not exist is not an error (rm -rf, as envd).
func (f *filesystemService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
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

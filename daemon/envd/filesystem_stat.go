package envd

import (
	"context"

	"connectrpc.com/connect"

	"github.com/sandman-dev/sandman/daemon/envd/spec/filesystem"
	"github.com/sandman-dev/sandman/daemon/internal/sandboxuser"
)

func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
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

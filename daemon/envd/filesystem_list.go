package envd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"connectrpc.com/connect"

	"github.com/sandman-dev/sandman/daemon/envd/spec/filesystem"
	"github.com/sandman-dev/sandman/daemon/internal/sandboxuser"
)

func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	u, p, err := f.path(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(req.Msg.GetDepth())
	if depth <= 0 {
		depth = 1 // the SDKs send 1 by default; envd reads 0 as 1
	}
	l := lister{names: sandboxuser.NewNames(), entries: []*filesystem.EntryInfo{}}
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

// lister collects the entries of a tree.
type lister struct {
	names   *sandboxuser.Names
	entries []*filesystem.EntryInfo
}

// walk lists dir and, depth > 1, the directories under it (never
// following links), in name order. Subdirectories it cannot read are
// listed without their contents.
func (l *lister) walk(ctx context.Context, dir string, depth int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	des, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, d := range des {
		if len(l.entries) >= maxListEntries {
			return connect.NewError(connect.CodeResourceExhausted,
				fmt.Errorf("more than %d entries: list with a smaller depth, or a subdirectory", maxListEntries))
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

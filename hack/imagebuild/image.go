package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one regular file of a layer.
type File struct {
	// Path is the absolute path in the image, e.g. /usr/local/bin/sandman-vk.
	Path string
	// Source is the file on disk to copy; Data is used when Source is empty.
	Source string
	Data   []byte
	Mode   fs.FileMode
}

// Config is what an image's config says beyond its layers.
type Config struct {
	Entrypoint []string
	User       string
	Env        []string
	// Created is the config's created time (deterministic: the epoch or
	// SOURCE_DATE_EPOCH).
	Created time.Time
}

const defaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// baseFiles is the base layer every image starts from: users and groups for
// root and nonroot (65532), and /tmp.
var baseFiles = []File{
	{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
	{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnonroot:x:65532:\n")},
}

// baseDirs are directories of the base layer with modes other than 0755.
var baseDirs = map[string]fs.FileMode{"/tmp": fs.ModeSticky | 0o777}

// Build makes an image of the base layer, one layer of files and cfg. The
// result depends only on its arguments and the bytes of the files.
func Build(files []File, cfg Config) (v1.Image, error) {
	base, err := layer(baseFiles, baseDirs)
	if err != nil {
		return nil, fmt.Errorf("base layer: %w", err)
	}
	bins, err := layer(files, nil)
	if err != nil {
		return nil, fmt.Errorf("binaries layer: %w", err)
	}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.AppendLayers(img, base, bins)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", "amd64"
	cf.Created = v1.Time{Time: epochOr(cfg.Created)}
	cf.History = nil // a history entry always carries a timestamp
	env := cfg.Env
	if len(env) == 0 {
		env = []string{defaultPath}
	}
	cf.Config = v1.Config{Entrypoint: cfg.Entrypoint, User: cfg.User, Env: env, WorkingDir: "/"}
	return mutate.ConfigFile(img, cf)
}

// epochOr is t in UTC, or the Unix epoch when t is zero.
func epochOr(t time.Time) time.Time {
	if t.IsZero() {
		return time.Unix(0, 0).UTC()
	}
	return t.UTC()
}

// layer packs files, their parent directories and the extra dirs into a
// reproducible gzip-compressed tar: entries sorted by path, mtime 0, owner
// 0:0 without names, directories 0755 unless dirs says otherwise.
func layer(files []File, dirs map[string]fs.FileMode) (v1.Layer, error) {
	type entry struct {
		file *File
		mode fs.FileMode // directories
	}
	entries := map[string]entry{}
	addDir := func(p string, mode fs.FileMode) {
		for d := p; d != "/" && d != "."; d = path.Dir(d) {
			if _, ok := entries[d]; !ok {
				entries[d] = entry{mode: 0o755}
			}
		}
		entries[p] = entry{mode: mode}
	}
	for d, mode := range dirs {
		addDir(path.Clean(d), mode)
	}
	for i := range files {
		f := &files[i]
		if !path.IsAbs(f.Path) || path.Clean(f.Path) != f.Path {
			return nil, fmt.Errorf("file path %q: want a clean absolute path", f.Path)
		}
		if e, ok := entries[f.Path]; ok && e.file != nil {
			return nil, fmt.Errorf("file %s given twice", f.Path)
		}
		if dir := path.Dir(f.Path); dir != "/" {
			if _, ok := entries[dir]; !ok {
				addDir(dir, 0o755)
			}
		}
		entries[f.Path] = entry{file: f}
	}
	names := make([]string, 0, len(entries))
	for p := range entries {
		names = append(names, p)
	}
	sort.Strings(names)

	var tarBuf bytes.Buffer
	tw := tar.NewWriter(&tarBuf)
	for _, p := range names {
		e := entries[p]
		hdr := &tar.Header{Name: strings.TrimPrefix(p, "/"), ModTime: time.Unix(0, 0)}
		if e.file == nil {
			hdr.Typeflag, hdr.Name = tar.TypeDir, hdr.Name+"/"
			hdr.Mode = tarMode(e.mode)
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, err
			}
			continue
		}
		data := e.file.Data
		if e.file.Source != "" {
			var err error
			if data, err = os.ReadFile(e.file.Source); err != nil {
				return nil, err
			}
		}
		hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeReg, tarMode(e.file.Mode), int64(len(data))
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}

	// compress/gzip writes a fixed header (no name, mtime 0); the output is
	// a function of the input and the Go version's compress/flate.
	var gzBuf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gzBuf, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(tarBuf.Bytes()); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	gz := gzBuf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(gz)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// tarMode is the tar header mode of m: permission bits plus setuid, setgid
// and sticky in their Unix places.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

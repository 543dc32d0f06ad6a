package daemon

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sandman-dev/sandman/daemon/api"
	"github.com/sandman-dev/sandman/daemon/archive"
)

// maxListEntries caps one listing.
const maxListEntries = 10000

// noDeadline lifts the server's read or write deadline for long transfers.
var noDeadline time.Time

// cleanPath checks that p is a usable absolute path and cleans it.
func cleanPath(param, p string) (string, error) {
	switch {
	case p == "":
		return "", errf(http.StatusBadRequest, api.CodeBadRequest, "%s is required (an absolute path)", param)
	case strings.ContainsRune(p, 0):
		return "", errf(http.StatusBadRequest, api.CodeBadRequest, "%s contains a NUL byte", param)
	case !strings.HasPrefix(p, "/"):
		return "", errf(http.StatusBadRequest, api.CodeBadRequest, "%s %q is not absolute: paths must start with /", param, p)
	}
	return path.Clean(p), nil
}

func queryPath(r *http.Request) (string, error) { return cleanPath("path", r.URL.Query().Get("path")) }

// parseMode parses an octal permission such as "0644" or "755".
func parseMode(v string, def fs.FileMode) (fs.FileMode, error) {
	if v == "" {
		return def, nil
	}
	m, err := strconv.ParseUint(v, 8, 32)
	if err != nil || m > 0o7777 {
		return 0, errf(http.StatusBadRequest, api.CodeBadRequest, "mode %q: want octal permission bits such as 0644", v)
	}
	return fs.FileMode(m).Perm() | fs.FileMode(m)&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky), nil
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	if err != nil {
		writeError(w, err)
		return
	}
	f, err := os.Open(p)
	if err != nil {
		writeError(w, err)
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeError(w, err)
		return
	}
	_ = http.NewResponseController(w).SetWriteDeadline(noDeadline)
	if r.URL.Query().Get("archive") == "tar" {
		if !fi.IsDir() {
			writeError(w, errf(http.StatusBadRequest, api.CodeNotADirectory, "%s is not a directory; read it without archive=tar", p))
			return
		}
		w.Header().Set("Content-Type", "application/x-tar")
		w.WriteHeader(http.StatusOK)
		if err := archive.Write(w, p); err != nil {
			s.log.Warn("tar download ended early", "path", p, "err", err)
			panic(http.ErrAbortHandler) // the client must not take a short tar for a whole one
		}
		return
	}
	if fi.IsDir() {
		writeError(w, errf(http.StatusBadRequest, api.CodeIsADirectory, "%s is a directory: list it (GET /v1/files/list) or download it with archive=tar", p))
		return
	}
	if !fi.Mode().IsRegular() || fi.Size() == 0 {
		// Devices, FIFOs and /proc files (size 0): stream what they give,
		// without a length.
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = io.Copy(w, f)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	http.ServeContent(w, r, "", fi.ModTime(), f)
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	if err != nil {
		writeError(w, err)
		return
	}
	q := r.URL.Query()
	_ = http.NewResponseController(w).SetReadDeadline(noDeadline)
	body := io.Reader(r.Body)
	if s.cfg.MaxUploadBytes > 0 {
		body = http.MaxBytesReader(w, r.Body, s.cfg.MaxUploadBytes)
	}
	if q.Get("archive") == "tar" {
		n, err := extractTar(body, p)
		if err != nil {
			writeError(w, uploadErr(err, s.cfg.MaxUploadBytes))
			return
		}
		writeJSON(w, http.StatusOK, api.WriteResult{Path: p, Entries: n})
		return
	}
	mode, err := parseMode(q.Get("mode"), 0o644)
	if err != nil {
		writeError(w, err)
		return
	}
	n, err := writeAtomic(p, body, mode)
	if err != nil {
		writeError(w, uploadErr(err, s.cfg.MaxUploadBytes))
		return
	}
	writeJSON(w, http.StatusOK, api.WriteResult{Path: p, Bytes: n})
}

func uploadErr(err error, limit int64) error {
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return errf(http.StatusRequestEntityTooLarge, api.CodeTooLarge, "upload over the daemon's limit of %d bytes; nothing was written", limit)
	}
	return err
}

// writeAtomic writes r to a temporary file beside p and renames it over p,
// creating p's parents. On any error p is left as it was.
func writeAtomic(p string, r io.Reader, mode fs.FileMode) (n int64, retErr error) {
	dir := filepath.Dir(p)
	if fi, err := os.Stat(p); err == nil && fi.IsDir() {
		return 0, errf(http.StatusBadRequest, api.CodeIsADirectory, "%s is a directory", p)
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(p)+".sandman-*")
	if err != nil {
		return 0, err
	}
	defer func() {
		if retErr != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	buf := make([]byte, 1<<20)
	n, err = io.CopyBuffer(struct{ io.Writer }{f}, r, buf)
	if err != nil {
		return n, fmt.Errorf("write %s: %w", p, err)
	}
	if err := f.Chmod(mode); err != nil {
		return n, err
	}
	if err := f.Close(); err != nil {
		return n, fmt.Errorf("write %s: %w", p, err)
	}
	return n, os.Rename(f.Name(), p)
}

// extractTar unpacks a tar stream into dir (created), with the rules of
// package archive; an unsafe entry or a broken archive is the caller's
// mistake (400), an upload over the limit stays a *http.MaxBytesError.
func extractTar(r io.Reader, dir string) (int, error) {
	n, err := archive.Extract(r, dir)
	var mbe *http.MaxBytesError
	switch {
	case err == nil || errors.As(err, &mbe):
		return n, err
	case errors.Is(err, archive.ErrUnsafe), errors.Is(err, archive.ErrBadArchive):
		return n, errf(http.StatusBadRequest, api.CodeBadRequest, "%v", err)
	}
	return n, err
}

func fileInfo(p string, fi fs.FileInfo) api.FileInfo {
	m := uint32(fi.Mode().Perm())
	for bit, sys := range map[fs.FileMode]uint32{fs.ModeSetuid: syscall.S_ISUID, fs.ModeSetgid: syscall.S_ISGID, fs.ModeSticky: syscall.S_ISVTX} {
		if fi.Mode()&bit != 0 {
			m |= sys
		}
	}
	out := api.FileInfo{Path: p, Name: fi.Name(), Size: fi.Size(), ModTime: fi.ModTime(), Mode: fmt.Sprintf("%04o", m)}
	switch {
	case fi.Mode().IsRegular():
		out.Type = "file"
	case fi.IsDir():
		out.Type = "dir"
	case fi.Mode()&fs.ModeSymlink != 0:
		out.Type = "symlink"
		out.Target, _ = os.Readlink(p)
	default:
		out.Type = "other"
	}
	return out
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	if err != nil {
		writeError(w, err)
		return
	}
	fi, err := os.Lstat(p)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, fileInfo(p, fi))
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	if err != nil {
		writeError(w, err)
		return
	}
	depth := 1
	if v := r.URL.Query().Get("depth"); v != "" {
		if depth, err = strconv.Atoi(v); err != nil || depth < 1 || depth > 64 {
			writeError(w, errf(http.StatusBadRequest, api.CodeBadRequest, "depth %q: want 1 to 64", v))
			return
		}
	}
	fi, err := os.Stat(p)
	if err != nil {
		writeError(w, err)
		return
	}
	if !fi.IsDir() {
		writeError(w, errf(http.StatusBadRequest, api.CodeNotADirectory, "%s is not a directory", p))
		return
	}
	out := api.FileList{Entries: []api.FileInfo{}}
	err = filepath.WalkDir(p, func(q string, d fs.DirEntry, err error) error {
		if err != nil {
			if q == p {
				return err
			}
			return nil // unreadable subdirectory: list what can be read
		}
		if q == p {
			return nil
		}
		if len(out.Entries) >= maxListEntries {
			out.Truncated = true
			return filepath.SkipAll
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		out.Entries = append(out.Entries, fileInfo(q, info))
		rel, _ := filepath.Rel(p, q)
		if d.IsDir() && strings.Count(rel, "/")+1 >= depth {
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) deleteFile(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	if err != nil {
		writeError(w, err)
		return
	}
	if p == "/" {
		writeError(w, errf(http.StatusBadRequest, api.CodeBadRequest, "refusing to delete /"))
		return
	}
	if _, err := os.Lstat(p); err != nil {
		writeError(w, err)
		return
	}
	if r.URL.Query().Get("recursive") == "1" {
		err = os.RemoveAll(p)
	} else {
		err = os.Remove(p)
		if errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST) {
			err = errf(http.StatusConflict, api.CodeConflict, "%s is a directory that is not empty: pass recursive=1", p)
		}
	}
	if err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) moveFile(w http.ResponseWriter, r *http.Request) {
	var req api.MoveRequest
	if err := s.decode(w, r, &req); err != nil {
		writeError(w, err)
		return
	}
	from, err := cleanPath("from", req.From)
	if err != nil {
		writeError(w, err)
		return
	}
	to, err := cleanPath("to", req.To)
	if err != nil {
		writeError(w, err)
		return
	}
	if _, err := os.Lstat(from); err != nil {
		writeError(w, err)
		return
	}
	if _, err := os.Lstat(to); err == nil && !req.Overwrite {
		writeError(w, errf(http.StatusConflict, api.CodeConflict, "%s exists: pass overwrite to replace it", to))
		return
	}
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		writeError(w, err)
		return
	}
	if err := os.Rename(from, to); err != nil {
		if errors.Is(err, syscall.EXDEV) {
			err = errf(http.StatusConflict, api.CodeConflict, "%s and %s are on different filesystems: copy and delete instead", from, to)
		}
		writeError(w, err)
		return
	}
	fi, err := os.Lstat(to)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, fileInfo(to, fi))
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request) {
	p, err := queryPath(r)
	if err != nil {
		writeError(w, err)
		return
	}
	mode, err := parseMode(r.URL.Query().Get("mode"), 0o755)
	if err != nil {
		writeError(w, err)
		return
	}
	if err := os.MkdirAll(p, mode); err != nil {
		writeError(w, err)
		return
	}
	fi, err := os.Stat(p)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, fileInfo(p, fi))
}

package daemon

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"mime"
	"mime/multipart"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/sandman-dev/sandman/daemon/internal/oserr"
	"github.com/sandman-dev/sandman/daemon/internal/sandboxuser"
)

// envdRESTRoutes adds envd's REST paths: /files, /health, /envs, /init,
// /metrics. As in envd, only /health answers without the access token.
func (s *Server) envdRESTRoutes(mux *http.ServeMux) {
	x := &envdREST{s: s}
	mux.HandleFunc("GET /health", x.health)
	mux.Handle("GET /files", s.envdFilesAuthenticated(http.HandlerFunc(x.download)))
	mux.Handle("POST /files", s.envdFilesAuthenticated(http.HandlerFunc(x.upload)))
	mux.Handle("GET /envs", s.envdAuthenticated(http.HandlerFunc(x.envs)))
	mux.Handle("POST /init", s.envdAuthenticated(http.HandlerFunc(x.postInit)))
	mux.Handle("GET /metrics", s.envdAuthenticated(http.HandlerFunc(x.metrics)))
}

// envdREST serves envd's REST paths.
type envdREST struct {
	s *Server

	// cpuMu guards cpuLast: the CPU sample of the previous /metrics, from
	// which the next one measures.
	cpuMu   sync.Mutex
	cpuLast *cpuSample
}

// envdFilesAuthenticated is envdAuthenticated for /files, which E2B's SDKs
// also reach by signed URLs (uploadUrl, downloadUrl: signature= and
// signature_expiration= instead of X-Access-Token). A signature is a
// SHA-256 over the path, the user and the access token itself; the daemon
// keeps only a hash of the token, so it cannot check one, and refuses them
// saying so. (The gateway, which knows the token, could check them and
// forward with X-Access-Token.) A request that carries the token too is
// served by the token, as envd does.
func (s *Server) envdFilesAuthenticated(h http.Handler) http.Handler {
	inner := s.envdAuthenticated(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("signature") != "" && s.access.Load().assigned && !s.envdAuthorized(r) {
			writeEnvdJSONError(w, http.StatusUnauthorized,
				"signed file URLs are not supported by this sandbox: the daemon keeps only a hash of the access token, so it cannot check E2B's signatures; send the request with the X-Access-Token header instead")
			return
		}
		inner.ServeHTTP(w, r)
	})
}

// writeEnvdJSONError writes envd's REST error: {"code": status, "message": …}.
func writeEnvdJSONError(w http.ResponseWriter, status int, format string, args ...any) {
	w.Header().Del("Content-Encoding")
	w.Header().Del("Content-Disposition")
	writeJSON(w, status, map[string]any{"code": status, "message": fmt.Sprintf(format, args...)})
}

// health answers 204, as envd does: the SDKs take any 2xx for a sandbox
// that runs (and a 502 from the proxy in front for one that does not).
func (x *envdREST) health(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusNoContent)
}

// envs answers the environment commands start with.
func (x *envdREST) envs(w http.ResponseWriter, r *http.Request) {
	out := map[string]string{}
	for _, kv := range x.s.access.Load().env {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "" {
			out[k] = v
		}
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, out)
}

// envdInitRequest is the body of POST /init (E2B's orchestrator sends it
// after a sandbox starts or resumes).
type envdInitRequest struct {
	EnvVars        map[string]string `json:"envVars"`
	AccessToken    *string           `json:"accessToken"`
	Timestamp      *time.Time        `json:"timestamp"`
	DefaultUser    *string           `json:"defaultUser"`
	DefaultWorkdir *string           `json:"defaultWorkdir"`
	HyperloopIP    *string           `json:"hyperloopIP"`
	VolumeMounts   []json.RawMessage `json:"volumeMounts"`
}

// postInit takes what of POST /init the daemon can honour, all or nothing:
// envVars join the environment of later commands; defaultWorkdir becomes
// their working directory (and where relative paths start); an
// accessToken must be one the sandbox already accepts (the tokens are set
// by the node agent and never change here); timestamp is ignored (the
// sandbox runs on its node's clock, which the daemon can neither set nor
// needs to). defaultUser, hyperloopIP and volumeMounts cannot be honoured
// and are refused with a message.
func (x *envdREST) postInit(w http.ResponseWriter, r *http.Request) {
	var req envdInitRequest
	body := http.MaxBytesReader(w, r.Body, x.s.cfg.MaxBodyBytes)
	if err := json.NewDecoder(body).Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		writeEnvdJSONError(w, http.StatusBadRequest, "malformed JSON body: %v", err)
		return
	}
	if req.AccessToken != nil && !x.s.access.Load().accepts(*req.AccessToken) {
		writeEnvdJSONError(w, http.StatusConflict,
			"the access token is set when the sandbox is assigned (its envdAccessToken) and cannot be changed by /init")
		return
	}
	var refused []string
	if req.DefaultUser != nil && *req.DefaultUser != "" {
		refused = append(refused, "defaultUser (calls without a user run as the daemon's own user; name the user per call)")
	}
	if req.HyperloopIP != nil && *req.HyperloopIP != "" {
		refused = append(refused, "hyperloopIP")
	}
	if len(req.VolumeMounts) > 0 {
		refused = append(refused, "volumeMounts (mount volumes through the pod spec)")
	}
	if len(refused) > 0 {
		writeEnvdJSONError(w, http.StatusBadRequest, "this sandbox cannot honour %s; nothing was changed", strings.Join(refused, ", "))
		return
	}
	dir := ""
	if req.DefaultWorkdir != nil && *req.DefaultWorkdir != "" {
		dir = filepath.Clean(*req.DefaultWorkdir)
		if fi, err := os.Stat(dir); !filepath.IsAbs(dir) || err != nil || !fi.IsDir() {
			writeEnvdJSONError(w, http.StatusBadRequest, "defaultWorkdir %q is not an existing directory given by an absolute path; nothing was changed", *req.DefaultWorkdir)
			return
		}
	}
	for k := range req.EnvVars {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			writeEnvdJSONError(w, http.StatusBadRequest, "environment variable name %q is not valid; nothing was changed", k)
			return
		}
	}
	for {
		old := x.s.access.Load()
		next := *old
		next.env = mergeEnv(old.env, req.EnvVars)
		if dir != "" {
			next.dir = dir
		}
		if x.s.access.CompareAndSwap(old, &next) {
			break
		}
	}
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusNoContent)
}

// restUser is the user of a /files call: the username parameter, else the
// HTTP Basic user.
func (x *envdREST) restUser(w http.ResponseWriter, r *http.Request) (*sandboxuser.User, bool) {
	name := envdUser(r.Context())
	if q := r.URL.Query(); q.Has("username") {
		name = q.Get("username")
	}
	u, err := x.s.envdUserFor(name)
	if err != nil {
		writeEnvdJSONError(w, http.StatusUnauthorized, "%v", err)
		return u, false
	}
	return u, true
}

// errorText is err's message without a Connect code prefix.
func errorText(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}

// download serves GET /files: the file's bytes, gzip-compressed when the
// client asks for it (Accept-Encoding), with ranges and conditional
// requests as http.ServeContent does them (uncompressed).
func (x *envdREST) download(w http.ResponseWriter, r *http.Request) {
	u, ok := x.restUser(w, r)
	if !ok {
		return
	}
	p, err := u.Resolve(r.URL.Query().Get("path"))
	if err != nil {
		writeEnvdJSONError(w, http.StatusBadRequest, "%s", errorText(err))
		return
	}
	// Opened as the user, read as anyone: permissions are checked on open.
	var f *os.File
	err = u.Do(func() (err error) {
		f, err = os.Open(p)
		return err
	})
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			writeEnvdJSONError(w, http.StatusNotFound, "path '%s' does not exist", p)
			return
		}
		writeEnvdJSONError(w, envdRESTStatus(err), "%s", oserr.Explain(err))
		return
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		writeEnvdJSONError(w, envdRESTStatus(err), "%v", err)
		return
	}
	if fi.IsDir() {
		writeEnvdJSONError(w, http.StatusBadRequest, "path '%s' is a directory: list it with ListDir, or download its files one by one", p)
		return
	}
	gz, err := acceptsGzip(r.Header.Get("Accept-Encoding"))
	if err != nil {
		writeEnvdJSONError(w, http.StatusNotAcceptable, "%v", err)
		return
	}
	if r.Header.Get("Range") != "" || r.Header.Get("If-Range") != "" ||
		r.Header.Get("If-Modified-Since") != "" || r.Header.Get("If-None-Match") != "" {
		gz = false // ranges and validators are served on the bytes themselves
	}
	ctype := mime.TypeByExtension(filepath.Ext(p))
	if ctype == "" {
		ctype = "application/octet-stream"
	}
	h := w.Header()
	h.Set("Content-Type", ctype)
	h.Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": filepath.Base(p)}))
	h.Set("Vary", "Accept-Encoding")
	_ = http.NewResponseController(w).SetWriteDeadline(noDeadline)
	switch {
	case gz:
		h.Set("Content-Encoding", "gzip")
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodHead {
			return
		}
		zw := gzip.NewWriter(w)
		if _, err := io.Copy(zw, f); err != nil {
			x.s.log.Warn("envd download ended early", "path", p, "err", err)
			panic(http.ErrAbortHandler) // a short gzip stream must not look whole
		}
		if err := zw.Close(); err != nil {
			panic(http.ErrAbortHandler)
		}
	case fi.Mode().IsRegular() && fi.Size() > 0:
		http.ServeContent(w, r, "", fi.ModTime(), f)
	default:
		// Empty files, and files whose size says nothing (/proc, FIFOs,
		// devices): what they give, without a length.
		if _, err := io.Copy(w, f); err != nil {
			panic(http.ErrAbortHandler)
		}
	}
}

// acceptsGzip reads Accept-Encoding: whether to send gzip (the one coding
// besides identity the daemon has, as envd), or an error if the client
// accepts neither.
func acceptsGzip(header string) (bool, error) {
	if strings.TrimSpace(header) == "" {
		return false, nil
	}
	type coding struct {
		name string
		q    float64
	}
	var cs []coding
	for _, part := range strings.Split(header, ",") {
		name, params, _ := strings.Cut(part, ";")
		c := coding{name: strings.ToLower(strings.TrimSpace(name)), q: 1}
		for _, p := range strings.Split(params, ";") {
			if k, v, ok := strings.Cut(strings.TrimSpace(p), "="); ok && strings.EqualFold(k, "q") {
				if q, err := strconv.ParseFloat(v, 64); err == nil {
					c.q = q
				}
			}
		}
		if c.name != "" {
			cs = append(cs, c)
		}
	}
	sort.SliceStable(cs, func(i, j int) bool { return cs[i].q > cs[j].q })
	identityOK := true
	for _, c := range cs {
		if (c.name == "identity" || c.name == "*") && c.q == 0 {
			identityOK = false
		}
	}
	for _, c := range cs {
		switch {
		case c.q == 0:
		case c.name == "gzip" || c.name == "x-gzip":
			return true, nil
		case c.name == "identity":
			return false, nil
		case c.name == "*":
			return !identityOK, nil
		}
	}
	if identityOK {
		return false, nil
	}
	return false, errors.New("no acceptable encoding: this sandbox sends identity or gzip")
}

// envdWriteInfo is one written file in the answer to POST /files.
type envdWriteInfo struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

var (
	// errUploadTooLarge: an upload (or what its compressed body expands
	// to) passed the daemon's limit.
	errUploadTooLarge = errors.New("upload over the daemon's limit")
	// errBadBody: the request body broke off or is malformed.
	errBadBody = errors.New("the request body could not be read")
)

// bodyReader remembers the error reading the body gave, to tell the
// client's failures from the disk's.
type bodyReader struct {
	r   io.Reader
	err error
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err != nil && err != io.EOF {
		b.err = err
	}
	return n, err
}

// capReader fails with errUploadTooLarge once more than left bytes pass.
type capReader struct {
	r    io.Reader
	left int64
}

func (c *capReader) Read(p []byte) (int, error) {
	if c.left < 0 {
		return 0, errUploadTooLarge
	}
	if int64(len(p)) > c.left+1 {
		p = p[:c.left+1]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if c.left < 0 {
		return n, errUploadTooLarge
	}
	return n, err
}

// upload serves POST /files: an application/octet-stream body written to
// the path parameter (envd ≥ 0.5.7; gzip Content-Encoding allowed), or a
// multipart/form-data body whose "file" parts are written to the path
// parameter or, without one, each to its part's file name (the SDKs put
// the whole destination path there). Relative paths start where the
// user's do; missing parents are made. Files are written in place, as
// envd writes them (so a watch sees them written); what the call creates
// belongs to the user. The answer lists the files written.
func (x *envdREST) upload(w http.ResponseWriter, r *http.Request) {
	u, ok := x.restUser(w, r)
	if !ok {
		return
	}
	for k := range r.Header {
		if strings.HasPrefix(k, "X-Metadata-") {
			writeEnvdJSONError(w, http.StatusBadRequest, "file metadata (%s headers, envd 0.6.2) is not supported by this sandbox", k)
			return
		}
	}
	limit := x.s.cfg.MaxUploadBytes
	if limit > 0 && r.ContentLength > limit {
		writeEnvdJSONError(w, http.StatusRequestEntityTooLarge,
			"upload of %d bytes is over the daemon's limit of %d bytes; nothing was written", r.ContentLength, limit)
		return
	}
	_ = http.NewResponseController(w).SetReadDeadline(noDeadline)
	body := io.Reader(r.Body)
	if limit > 0 {
		body = http.MaxBytesReader(w, r.Body, limit)
	}
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(body)
		if err != nil {
			writeEnvdJSONError(w, http.StatusBadRequest, "the body is not gzip, as Content-Encoding says: %v", err)
			return
		}
		defer zr.Close()
		body = zr
	default:
		writeEnvdJSONError(w, http.StatusBadRequest, "unsupported Content-Encoding %q: send identity or gzip", enc)
		return
	}
	if limit > 0 {
		body = &capReader{r: body, left: limit}
	}
	q := r.URL.Query()
	mediaType, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	written := []envdWriteInfo{}
	fail := func(err error, dst string) {
		msg := errorText(oserr.Explain(err))
		status := envdRESTStatus(err)
		switch status {
		case http.StatusRequestEntityTooLarge:
			msg = fmt.Sprintf("upload over the daemon's limit of %d bytes; %s was not written", limit, dst)
		case http.StatusInsufficientStorage:
			msg = fmt.Sprintf("not enough disk space available: %s was not written (%v)", dst, err)
		}
		if len(written) > 0 {
			var names []string
			for _, e := range written {
				names = append(names, e.Path)
			}
			msg += "; written before it: " + strings.Join(names, ", ")
		}
		writeEnvdJSONError(w, status, "%s", msg)
	}
	switch {
	case mediaType == "application/octet-stream":
		if !q.Has("path") || q.Get("path") == "" {
			writeEnvdJSONError(w, http.StatusBadRequest, "the path parameter is required for an application/octet-stream upload")
			return
		}
		dst, err := u.Resolve(q.Get("path"))
		if err != nil {
			writeEnvdJSONError(w, http.StatusBadRequest, "%s", errorText(err))
			return
		}
		if err := envdWriteFile(u, dst, body); err != nil {
			fail(err, dst)
			return
		}
		written = append(written, envdWriteInfo{Name: filepath.Base(dst), Type: "file", Path: dst})
	case strings.HasPrefix(mediaType, "multipart/"):
		if params["boundary"] == "" {
			writeEnvdJSONError(w, http.StatusBadRequest, "a multipart body needs a boundary in its Content-Type")
			return
		}
		mr := multipart.NewReader(body, params["boundary"])
		for {
			part, err := mr.NextPart()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				fail(fmt.Errorf("%w: malformed multipart body: %w", errBadBody, err), "the rest")
				return
			}
			if part.FormName() != "file" {
				continue // envd reads only "file" parts
			}
			name := q.Get("path")
			if name == "" {
				name = partFileName(part)
			}
			if name == "" {
				writeEnvdJSONError(w, http.StatusBadRequest, "a file part has no file name and the path parameter is not set: name the destination in either")
				return
			}
			dst, err := u.Resolve(name)
			if err != nil {
				writeEnvdJSONError(w, http.StatusBadRequest, "%s", errorText(err))
				return
			}
			for _, e := range written {
				if e.Path == dst {
					fail(fmt.Errorf("%w: two files in one upload go to %s: give each its own path (leave the path parameter out and name each part)", syscall.EINVAL, dst), dst)
					return
				}
			}
			if err := envdWriteFile(u, dst, part); err != nil {
				fail(err, dst)
				return
			}
			written = append(written, envdWriteInfo{Name: filepath.Base(dst), Type: "file", Path: dst})
		}
		if len(written) == 0 {
			writeEnvdJSONError(w, http.StatusBadRequest, `the multipart body has no "file" part`)
			return
		}
	default:
		writeEnvdJSONError(w, http.StatusBadRequest, "unsupported Content-Type %q: send multipart/form-data or application/octet-stream", r.Header.Get("Content-Type"))
		return
	}
	writeJSON(w, http.StatusOK, written)
}

// partFileName is a part's file name as sent, directories included
// (multipart.Part.FileName keeps only the last element).
func partFileName(p *multipart.Part) string {
	_, params, err := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
	if err != nil {
		return ""
	}
	return params["filename"]
}

// envdWriteFile writes r to dst in place (truncating a file there, writing
// through a link there, as a shell's > does), making dst's missing parents.
// The file is opened and the parents made with u's credentials, so what
// it creates is u's and u must be allowed to write there; the bytes are
// then copied from the network without them. If the copy fails, a file it
// created is removed, with the parents it made, and a file that was there
// is left empty, so no partial content passes for a whole file.
func envdWriteFile(u *sandboxuser.User, dst string, r io.Reader) (retErr error) {
	var (
		f       *os.File
		made    []string
		created bool
	)
	err := u.Do(func() (err error) {
		if fi, err := os.Stat(dst); err == nil && fi.IsDir() {
			return &fs.PathError{Op: "write", Path: dst, Err: syscall.EISDIR}
		}
		if made, err = mkdirAll(filepath.Dir(dst)); err != nil {
			return err
		}
		_, statErr := os.Stat(dst)
		created = errors.Is(statErr, fs.ErrNotExist)
		if f, err = os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o666); err != nil {
			undoDirs(made)
		}
		return err
	})
	if err != nil {
		return err
	}
	defer func() {
		if retErr == nil {
			return
		}
		if created {
			f.Close()
			_ = u.Do(func() error {
				_ = os.Remove(dst)
				undoDirs(made)
				return nil
			})
			return
		}
		_ = f.Truncate(0)
		f.Close()
	}()
	buf := make([]byte, 1<<20)
	src := &bodyReader{r: r}
	if _, err := io.CopyBuffer(struct{ io.Writer }{f}, src, buf); err != nil {
		if src.err != nil {
			return fmt.Errorf("%w for %s: %w", errBadBody, dst, src.err)
		}
		return fmt.Errorf("write %s: %w", dst, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", dst, err)
	}
	return nil
}

// undoDirs removes directories made (outermost first), innermost first.
func undoDirs(made []string) {
	for i := len(made) - 1; i >= 0; i-- {
		_ = os.Remove(made[i])
	}
}

// envdMetrics is envd's answer to GET /metrics.
type envdMetrics struct {
	Ts          int64   `json:"ts"`
	CPUCount    int     `json:"cpu_count"`
	CPUUsedPct  float64 `json:"cpu_used_pct"`
	MemTotal    uint64  `json:"mem_total"`
	MemUsed     uint64  `json:"mem_used"`
	MemCache    uint64  `json:"mem_cache"`
	MemTotalMiB uint64  `json:"mem_total_mib"`
	MemUsedMiB  uint64  `json:"mem_used_mib"`
	DiskTotal   uint64  `json:"disk_total"`
	DiskUsed    uint64  `json:"disk_used"`
}

// metrics reports the sandbox's CPU, memory and disk as envd does: from
// its cgroup (v2, or v1's hierarchies) where it has one, else from /proc;
// the disk is the root filesystem's. CPU use is measured since the
// previous call (the first call measures over 100 ms).
func (x *envdREST) metrics(w http.ResponseWriter, r *http.Request) {
	cg := findCgroup()
	cpus := cg.cpuCount()
	pct, err := x.cpuPercent(r.Context(), cg, cpus)
	if err != nil {
		return // the client went away
	}
	m := envdMetrics{Ts: x.s.cfg.Now().Unix(), CPUCount: cpus, CPUUsedPct: pct}
	m.MemTotal, m.MemUsed, m.MemCache = cg.memoryUse()
	m.MemTotalMiB, m.MemUsedMiB = m.MemTotal>>20, m.MemUsed>>20
	var st unix.Statfs_t
	if err := unix.Statfs("/", &st); err == nil {
		m.DiskTotal = st.Blocks * uint64(st.Bsize)
		m.DiskUsed = (st.Blocks - st.Bfree) * uint64(st.Bsize)
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusOK, m)
}

// cpuSample is a reading of CPU time: the cgroup's, against wall time, or
// (without a cgroup) the machine's busy and total jiffies.
type cpuSample struct {
	cgroup      bool
	used        time.Duration
	at          time.Time
	busy, total uint64
}

func (x *envdREST) cpuPercent(ctx context.Context, cg cgroupFiles, cpus int) (float64, error) {
	x.cpuMu.Lock()
	defer x.cpuMu.Unlock()
	prev := x.cpuLast
	if prev == nil {
		s := cg.cpuSample()
		prev = &s
		t := time.NewTimer(100 * time.Millisecond)
		defer t.Stop()
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-t.C:
		}
	}
	cur := cg.cpuSample()
	x.cpuLast = &cur
	pct := 0.0
	switch {
	case cur.cgroup && prev.cgroup:
		if wall := cur.at.Sub(prev.at); wall > 0 && cpus > 0 {
			pct = 100 * float64(cur.used-prev.used) / float64(wall) / float64(cpus)
		}
	case !cur.cgroup && !prev.cgroup:
		if cur.total > prev.total {
			pct = 100 * float64(cur.busy-prev.busy) / float64(cur.total-prev.total)
		}
	}
	pct = math.Max(0, math.Min(100, pct))
	return math.Round(pct*100) / 100, nil
}

// cgroupFiles locates the sandbox's cgroup: v2's directory, or v1's per
// controller (each "" when absent).
type cgroupFiles struct {
	v2         string
	cpu, cpuac string
	memory     string
}

const cgroupRoot = "/sys/fs/cgroup"

// findCgroup reads /proc/self/cgroup. Inside a cgroup namespace the path
// is "/" and the hierarchy's root is the sandbox's; without one, the
// sandbox's own directory is mounted at the hierarchy's root, so that is
// tried too.
func findCgroup() cgroupFiles {
	var out cgroupFiles
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return out
	}
	pick := func(dir, rel, probe string) string {
		for _, d := range []string{filepath.Join(dir, rel), dir} {
			if _, err := os.Stat(filepath.Join(d, probe)); err == nil {
				return d
			}
		}
		return ""
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			out.v2 = pick(cgroupRoot, parts[2], "cgroup.controllers")
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			switch c {
			case "cpu":
				out.cpu = pick(filepath.Join(cgroupRoot, "cpu"), parts[2], "cpu.cfs_quota_us")
			case "cpuacct":
				out.cpuac = pick(filepath.Join(cgroupRoot, "cpuacct"), parts[2], "cpuacct.usage")
			case "memory":
				out.memory = pick(filepath.Join(cgroupRoot, "memory"), parts[2], "memory.usage_in_bytes")
			}
		}
	}
	return out
}

func readTrim(p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func readUint(p string) (uint64, bool) {
	v, err := strconv.ParseUint(readTrim(p), 10, 64)
	return v, err == nil
}

// readKV reads "key value" lines (cpu.stat, memory.stat, /proc/meminfo).
func readKV(p string) map[string]uint64 {
	out := map[string]uint64{}
	f, err := os.Open(p)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		if v, err := strconv.ParseUint(fields[1], 10, 64); err == nil {
			out[strings.TrimSuffix(fields[0], ":")] = v
		}
	}
	return out
}

// cpuCount is the CPUs the sandbox may use: those it may run on, fewer if
// its CPU quota says so.
func (cg cgroupFiles) cpuCount() int {
	n := runtime.NumCPU()
	var quota, period float64
	if cg.v2 != "" {
		if f := strings.Fields(readTrim(filepath.Join(cg.v2, "cpu.max"))); len(f) == 2 && f[0] != "max" {
			quota, _ = strconv.ParseFloat(f[0], 64)
			period, _ = strconv.ParseFloat(f[1], 64)
		}
	} else if cg.cpu != "" {
		quota, _ = strconv.ParseFloat(readTrim(filepath.Join(cg.cpu, "cpu.cfs_quota_us")), 64)
		period, _ = strconv.ParseFloat(readTrim(filepath.Join(cg.cpu, "cpu.cfs_period_us")), 64)
	}
	if quota > 0 && period > 0 {
		n = min(n, max(1, int(math.Ceil(quota/period))))
	}
	return n
}

func (cg cgroupFiles) cpuSample() cpuSample {
	now := time.Now()
	if cg.v2 != "" {
		if us, ok := readKV(filepath.Join(cg.v2, "cpu.stat"))["usage_usec"]; ok {
			return cpuSample{cgroup: true, used: time.Duration(us) * time.Microsecond, at: now}
		}
	}
	if cg.cpuac != "" {
		if ns, ok := readUint(filepath.Join(cg.cpuac, "cpuacct.usage")); ok {
			return cpuSample{cgroup: true, used: time.Duration(ns), at: now}
		}
	}
	s := cpuSample{at: now}
	for _, line := range strings.Split(readTrim("/proc/stat"), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 || f[0] != "cpu" {
			continue
		}
		for i, v := range f[1:] {
			n, _ := strconv.ParseUint(v, 10, 64)
			s.total += n
			if i != 3 && i != 4 { // idle, iowait
				s.busy += n
			}
		}
	}
	return s
}

// memory is the sandbox's memory limit (the machine's memory if lower or
// unlimited), use (without reclaimable page cache) and page cache.
func (cg cgroupFiles) memoryUse() (total, used, cache uint64) {
	info := readKV("/proc/meminfo")
	total = info["MemTotal"] * 1024
	used = (info["MemTotal"] - min(info["MemTotal"], info["MemAvailable"])) * 1024
	cache = (info["Cached"] + info["Buffers"]) * 1024
	var limit, usage uint64
	var stat map[string]uint64
	var haveUsage bool
	switch {
	case cg.v2 != "":
		if l, ok := readUint(filepath.Join(cg.v2, "memory.max")); ok {
			limit = l
		}
		usage, haveUsage = readUint(filepath.Join(cg.v2, "memory.current"))
		stat = readKV(filepath.Join(cg.v2, "memory.stat"))
		stat["cache"], stat["inactive"] = stat["file"], stat["inactive_file"]
	case cg.memory != "":
		limit, _ = readUint(filepath.Join(cg.memory, "memory.limit_in_bytes"))
		usage, haveUsage = readUint(filepath.Join(cg.memory, "memory.usage_in_bytes"))
		stat = readKV(filepath.Join(cg.memory, "memory.stat"))
		stat["inactive"] = stat["total_inactive_file"]
		if c, ok := stat["total_cache"]; ok {
			stat["cache"] = c
		}
	}
	if limit > 0 && (total == 0 || limit < total) {
		total = limit
	}
	if haveUsage {
		used = usage - min(usage, stat["inactive"])
		cache = stat["cache"]
	}
	return total, min(used, total), cache
}

package envd

import (
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"slices"
	"strings"
	"syscall"
	"unicode/utf8"

	"golang.org/x/sys/unix"
)

// File metadata, as envd 0.6.2 keeps it: an upload's X-Metadata-<key>
// headers become the written file's extended attributes user.e2b.<key>
// (the key lowercased, as envd does), replacing every user.e2b.* the file
// had, so an upload without them clears its metadata. Stat, ListDir, Move,
// MakeDir, watch entries and the upload's answer show a file's
// user.e2b.* attributes as EntryInfo.metadata. The attributes live with
// the inode, so a rename keeps them, and the sandbox's own tools
// (getfattr, setfattr) see and change the same thing.
const (
	metadataHeaderPrefix = "X-Metadata-"
	metadataXattrPrefix  = "user.e2b."
	// maxMetadataKeyLen: the kernel caps an attribute's name at 255 bytes,
	// prefix included.
	maxMetadataKeyLen = 255 - len(metadataXattrPrefix)
	// maxMetadataBytes caps one file's metadata (names with their prefix,
	// and values), as envd does: ext4 keeps a file's attributes in one
	// 4 KiB block.
	maxMetadataBytes = 4096
)

// errMetadataUnsupported: metadata was asked for on a file that cannot hold
// it (a filesystem without user extended attributes, or a device or FIFO).
var errMetadataUnsupported = errors.New("file metadata cannot be stored")

// metadataFromHeaders is the metadata an upload's headers ask for (nil for
// none): X-Metadata-<key>: <value>, the key lowercased; a key sent twice
// keeps its first value; X-Metadata- with no key is ignored (as envd).
// Keys and values must be printable US-ASCII, a key at most
// maxMetadataKeyLen bytes, all of it at most maxMetadataBytes.
func metadataFromHeaders(h http.Header) (map[string]string, error) {
	var md map[string]string
	names := make([]string, 0, len(h))
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names) // the same answer whichever spelling comes first
	for _, name := range names {
		vs := h[name]
		if len(vs) == 0 || len(name) < len(metadataHeaderPrefix) || !strings.EqualFold(name[:len(metadataHeaderPrefix)], metadataHeaderPrefix) {
			continue
		}
		key := strings.ToLower(name[len(metadataHeaderPrefix):])
		if key == "" {
			continue
		}
		if _, dup := md[key]; dup {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = vs[0]
	}
	return md, validateMetadata(md)
}

// validateMetadata checks md against envd's limits, before anything is
// written.
func validateMetadata(md map[string]string) error {
	total := 0
	for k, v := range md {
		if len(k) > maxMetadataKeyLen {
			return fmt.Errorf("invalid metadata: key %q is %d bytes, over the limit of %d", k, len(k), maxMetadataKeyLen)
		}
		if i := notPrintable(k); i >= 0 {
			return fmt.Errorf("invalid metadata: key %q has byte 0x%02x at %d; keys and values must be printable US-ASCII", k, k[i], i)
		}
		if i := notPrintable(v); i >= 0 {
			return fmt.Errorf("invalid metadata: the value of %q has byte 0x%02x at %d; keys and values must be printable US-ASCII", k, v[i], i)
		}
		total += len(metadataXattrPrefix) + len(k) + len(v)
	}
	if total > maxMetadataBytes {
		return fmt.Errorf("invalid metadata: %d bytes (keys with their %q prefix, and values), over the limit of %d per file", total, metadataXattrPrefix, maxMetadataBytes)
	}
	return nil
}

// notPrintable is the index of s's first byte outside 0x20-0x7e, or -1.
func notPrintable(s string) int {
	for i := range len(s) {
		if s[i] < 0x20 || s[i] > 0x7e {
			return i
		}
	}
	return -1
}

// setMetadata makes md the metadata of the open file f (path p, for
// messages): it sets md's keys, then removes the user.e2b.* attributes md
// does not name. It runs with the caller's credentials, so the kernel
// checks that they may change the file. Metadata asked for on a file that
// cannot hold it is an error (errMetadataUnsupported, naming the file and
// why) before anything changes; with none asked for, such a file has
// nothing to clear.
func setMetadata(f *os.File, p string, md map[string]string) error {
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	if m := fi.Mode(); !m.IsRegular() && !m.IsDir() {
		if len(md) > 0 {
			return fmt.Errorf("%w on %s: it is a %s, and Linux keeps user extended attributes only on regular files and directories; write it without metadata", errMetadataUnsupported, p, kindOf(m))
		}
		return nil
	}
	fd := int(f.Fd())
	names, err := listXattrs(func(b []byte) (int, error) { return unix.Flistxattr(fd, b) })
	if err != nil {
		if xattrUnsupported(err) {
			if len(md) > 0 {
				return unsupportedFS(p, err)
			}
			return nil
		}
		return fmt.Errorf("read the metadata of %s: %w", p, err)
	}
	keys := make([]string, 0, len(md))
	for k := range md {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if err := unix.Fsetxattr(fd, metadataXattrPrefix+k, []byte(md[k]), 0); err != nil {
			if xattrUnsupported(err) {
				return unsupportedFS(p, err)
			}
			return fmt.Errorf("store metadata %q on %s: %w", k, p, &fs.PathError{Op: "setxattr", Path: p, Err: err})
		}
	}
	for _, name := range names {
		key, ok := strings.CutPrefix(name, metadataXattrPrefix)
		if _, keep := md[key]; !ok || keep {
			continue
		}
		if err := unix.Fremovexattr(fd, name); err != nil && !errors.Is(err, unix.ENODATA) {
			return fmt.Errorf("clear metadata %q of %s: %w", key, p, &fs.PathError{Op: "removexattr", Path: p, Err: err})
		}
	}
	return nil
}

func unsupportedFS(p string, err error) error {
	return fmt.Errorf("%w on %s: its filesystem has no user extended attributes (%v); write it without metadata, or to the sandbox's disk", errMetadataUnsupported, p, err)
}

func kindOf(m fs.FileMode) string {
	switch {
	case m&fs.ModeCharDevice != 0:
		return "character device"
	case m&fs.ModeDevice != 0:
		return "block device"
	case m&fs.ModeNamedPipe != 0:
		return "FIFO"
	case m&fs.ModeSocket != 0:
		return "socket"
	case m&fs.ModeSymlink != 0:
		return "symbolic link"
	}
	return "special file"
}

// xattrUnsupported: the filesystem has no (user) extended attributes.
func xattrUnsupported(err error) bool {
	return errors.Is(err, syscall.ENOTSUP) || errors.Is(err, syscall.EOPNOTSUPP)
}

// readMetadata is p's metadata (following a final symbolic link, as envd
// does), or nil: best effort, as in envd, since a listing must not fail
// for one file's attributes. Attributes the caller may not read, and
// values that are not UTF-8 (set inside the sandbox; a protobuf string
// must be), are left out.
func readMetadata(p string) map[string]string {
	names, err := listXattrs(func(b []byte) (int, error) { return unix.Listxattr(p, b) })
	if err != nil {
		return nil
	}
	var md map[string]string
	var buf [256]byte
	for _, name := range names {
		key, ok := strings.CutPrefix(name, metadataXattrPrefix)
		if !ok || !utf8.ValidString(key) {
			continue
		}
		v, err := getXattr(p, name, buf[:])
		if err != nil || !utf8.Valid(v) {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = string(v)
	}
	return md
}

// listXattrs lists attribute names with list (listxattr or flistxattr).
func listXattrs(list func([]byte) (int, error)) ([]string, error) {
	var small [512]byte
	b := small[:]
	for {
		n, err := list(b)
		if errors.Is(err, unix.ERANGE) {
			size, serr := list(nil)
			if serr != nil {
				return nil, serr
			}
			b = make([]byte, size+64)
			continue
		}
		if err != nil {
			return nil, err
		}
		var names []string
		for _, name := range strings.Split(string(b[:n]), "\x00") {
			if name != "" {
				names = append(names, name)
			}
		}
		return names, nil
	}
}

// getXattr reads attribute name of p into buf, or a larger buffer.
func getXattr(p, name string, buf []byte) ([]byte, error) {
	for {
		n, err := unix.Getxattr(p, name, buf)
		if errors.Is(err, unix.ERANGE) {
			size, serr := unix.Getxattr(p, name, nil)
			if serr != nil {
				return nil, serr
			}
			buf = make([]byte, size+64)
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

package sandboxuser

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Names turns uids and gids into names from the sandbox's /etc/passwd and
// /etc/group, read once (numbers for ids they do not list).
type Names struct {
	users, groups map[uint32]string
	// stamp is what the files looked like when read, for Refresh.
	stamp string
}

// NewNames reads the account databases.
func NewNames() *Names {
	n := &Names{}
	n.load()
	return n
}

func (n *Names) load() {
	n.users = readIDNames(PasswdFile)
	n.groups = readIDNames(GroupFile)
	n.stamp = namesStamp()
}

// Refresh reloads the names if the files changed.
func (n *Names) Refresh() {
	if namesStamp() != n.stamp {
		n.load()
	}
}

// User is uid's name.
func (n *Names) User(uid uint32) string { return name(n.users, uid) }

// Group is gid's name.
func (n *Names) Group(gid uint32) string { return name(n.groups, gid) }

func name(m map[uint32]string, id uint32) string {
	if s, ok := m[id]; ok {
		return s
	}
	return strconv.FormatUint(uint64(id), 10)
}

func namesStamp() string {
	var b strings.Builder
	for _, f := range []string{PasswdFile, GroupFile} {
		if fi, err := os.Stat(f); err == nil {
			fmt.Fprintf(&b, "%d/%d;", fi.ModTime().UnixNano(), fi.Size())
		}
	}
	return b.String()
}

// readIDNames reads name:x:id:… lines (passwd and group alike).
func readIDNames(file string) map[uint32]string {
	out := map[uint32]string{}
	f, err := os.Open(file)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.SplitN(sc.Text(), ":", 4)
		if len(fields) < 3 {
			continue
		}
		id, err := strconv.ParseUint(fields[2], 10, 32)
		if err != nil {
			continue
		}
		if _, dup := out[uint32(id)]; !dup {
			out[uint32(id)] = fields[0]
		}
	}
	return out
}

package noderuntime

import "golang.org/x/sys/unix"

// hostMemory is the host's total memory in bytes.
func hostMemory() int64 {
	var info unix.Sysinfo_t
	if err := unix.Sysinfo(&info); err != nil {
		return 0
	}
	return int64(info.Totalram) * int64(info.Unit)
}

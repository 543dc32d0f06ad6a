package envd

import (
	"bufio"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

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

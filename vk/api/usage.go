package api

import "time"

// UsageRequest asks the virtual node for the resource use it sampled of
// some of its pods (GET APIPrefix+"usage", query namespace=NS, pod=NAME
// repeated, start and end as Unix seconds, latest=true). Start and End
// bound the samples' times, both included (zero: unbounded); Latest keeps
// only each pod's newest sample in the range.
type UsageRequest struct {
	Namespace string
	Pods      []string
	Start     time.Time
	End       time.Time
	Latest    bool
}

// UsageSample is one reading of a sandbox's resource use. CPUUsedPct is
// the CPU time the sandbox used since the sample before it (since it
// started, for the first), as a percentage of CPUCount cores over that
// time (0–100). Memory is the working set; a limit of 0 is none known.
// Disk is what the sandbox wrote to its containers' filesystems, as the
// node agent's disk check last measured it, against their caps.
type UsageSample struct {
	Time             time.Time `json:"time"`
	CPUCount         int64     `json:"cpu_count"`
	CPUUsedPct       float64   `json:"cpu_used_pct"`
	MemoryBytes      uint64    `json:"memory_bytes"`
	MemoryLimitBytes uint64    `json:"memory_limit_bytes"`
	DiskBytes        uint64    `json:"disk_bytes"`
	DiskLimitBytes   uint64    `json:"disk_limit_bytes"`
}

// PodUsage is a pod's samples, oldest first. Recent samples are a few
// seconds apart; older ones are thinned out so the whole life of the pod
// fits a fixed number of samples (the gap doubles each time it fills).
type PodUsage struct {
	Namespace string        `json:"namespace"`
	Pod       string        `json:"pod"`
	Samples   []UsageSample `json:"samples"`
}

// UsageResponse answers a UsageRequest: the pods asked for that the
// virtual node holds (a pod it does not is left out).
type UsageResponse struct {
	Pods []PodUsage `json:"pods"`
}

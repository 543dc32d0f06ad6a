package soakreport

import (
	"fmt"
	"slices"
)

// A BoundSlot is a slot that holds a pod (bound or binding), as a node
// agent's inventory reports it.
type BoundSlot struct {
	Agent string `json:"agent"`
	Slot  string `json:"slot"`
	UID   string `json:"uid"`
	Pod   string `json:"pod"` // namespace/name
}

// DoubleBound lists the pods held by more than one slot, on one agent or
// across agents.
func DoubleBound(slots []BoundSlot) []string {
	byUID := map[string][]BoundSlot{}
	var uids []string
	for _, s := range slots {
		if _, ok := byUID[s.UID]; !ok {
			uids = append(uids, s.UID)
		}
		byUID[s.UID] = append(byUID[s.UID], s)
	}
	var out []string
	for _, uid := range uids {
		held := byUID[uid]
		if len(held) < 2 {
			continue
		}
		var where []string
		for _, s := range held {
			where = append(where, s.Agent+"/"+s.Slot)
		}
		slices.Sort(where)
		out = append(out, fmt.Sprintf("pod %s (uid %s) bound %d times: %v", held[0].Pod, uid, len(held), where))
	}
	return out
}

// A PodState is what the soak needs of a pod in the API.
type PodState struct {
	UID  string
	Name string
	// Terminal: phase Succeeded or Failed.
	Terminal bool
}

// Orphans lists the slots that hold a pod the API no longer has, or one
// that has ended: after a fault the pool has converged only once none is
// left (the virtual node releases them).
func Orphans(slots []BoundSlot, pods []PodState) []string {
	byUID := map[string]PodState{}
	for _, p := range pods {
		byUID[p.UID] = p
	}
	var out []string
	for _, s := range slots {
		p, ok := byUID[s.UID]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("%s/%s holds %s, gone from the API", s.Agent, s.Slot, s.Pod))
		case p.Terminal:
			out = append(out, fmt.Sprintf("%s/%s holds %s, which has ended", s.Agent, s.Slot, s.Pod))
		}
	}
	return out
}

// SharedAddresses lists pod IPs that more than one running pod reports, as
// "ip: a, b" (names sorted).
func SharedAddresses(ipOf map[string]string) []string {
	byIP := map[string][]string{}
	for name, ip := range ipOf {
		if ip != "" {
			byIP[ip] = append(byIP[ip], name)
		}
	}
	var out []string
	for ip, names := range byIP {
		if len(names) > 1 {
			slices.Sort(names)
			out = append(out, fmt.Sprintf("%s: %v", ip, names))
		}
	}
	slices.Sort(out)
	return out
}

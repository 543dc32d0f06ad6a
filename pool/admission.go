package pool

import "container/heap"

// admission is the queue of pods waiting for a slot: first in, first out
// within a trainer job, and fair across jobs: a freed slot goes to the
// waiting job that holds the fewest of the pool's slots (max-min fair
// sharing), so a job that arrives while another's burst holds the pool gets
// the slots that burst frees until the two hold as many (or it has none
// waiting), and one job's burst of thousands does not starve another's
// single pod. Among jobs holding as many, the one served longest ago goes
// first (round-robin), then the one that queued first.
type admission struct {
	// jobs in the order they first queued; each with its pods in order.
	order []string
	jobs  map[string][]Request
	// byUID: queued pods; announced: pods told they wait.
	byUID    map[string]string // uid → job
	announce map[string]bool
	// served: when each queued job last had a pod taken, in turns.
	served map[string]uint64
	turns  uint64
	n      int
	// fresh: pods queued since the last round, not yet told they wait.
	fresh []Request
}

func newAdmission() admission {
	return admission{jobs: map[string][]Request{}, byUID: map[string]string{}, announce: map[string]bool{}, served: map[string]uint64{}}
}

func (a *admission) len() int { return a.n }

func (a *admission) has(uid string) bool {
	_, ok := a.byUID[uid]
	return ok
}

// get returns a queued pod's request.
func (a *admission) get(uid string) (Request, bool) {
	job, ok := a.byUID[uid]
	if !ok {
		return Request{}, false
	}
	for _, r := range a.jobs[job] {
		if r.Bind.Pod.UID == uid {
			return r, true
		}
	}
	return Request{}, false
}

func (a *admission) push(req Request) { a.insert(req, false) }

// pushFront puts a pod back at the head of its job's queue (a bind that a
// node could not take is tried again before newer pods).
func (a *admission) pushFront(req Request) { a.insert(req, true) }

func (a *admission) insert(req Request, front bool) {
	job := req.Job
	q, ok := a.jobs[job]
	if !ok {
		a.order = append(a.order, job)
	}
	if front {
		q = append([]Request{req}, q...)
	} else {
		q = append(q, req)
	}
	a.jobs[job] = q
	a.byUID[req.Bind.Pod.UID] = job
	a.n++
	if !front {
		a.fresh = append(a.fresh, req)
	}
}

// takeFresh returns the pods queued since the last call that still wait
// and were not told so yet, and marks them told.
func (a *admission) takeFresh() []Request {
	var out []Request
	for _, req := range a.fresh {
		uid := req.Bind.Pod.UID
		if a.has(uid) && !a.announced(uid) {
			out = append(out, req)
		}
	}
	a.fresh = a.fresh[:0]
	return out
}

func (a *admission) remove(uid string) bool {
	job, ok := a.byUID[uid]
	if !ok {
		return false
	}
	q := a.jobs[job]
	for i, r := range q {
		if r.Bind.Pod.UID == uid {
			q = append(q[:i:i], q[i+1:]...)
			break
		}
	}
	a.setJob(job, q)
	delete(a.byUID, uid)
	delete(a.announce, uid)
	a.n--
	return true
}

func (a *admission) setJob(job string, q []Request) {
	if len(q) > 0 {
		a.jobs[job] = q
		return
	}
	delete(a.jobs, job)
	delete(a.served, job)
	for i, j := range a.order {
		if j == job {
			a.order = append(a.order[:i:i], a.order[i+1:]...)
			break
		}
	}
}

// announced reports whether uid was already told it waits, and marks it.
func (a *admission) announced(uid string) bool {
	if a.announce[uid] {
		return true
	}
	a.announce[uid] = true
	return false
}

// position is uid's place if the jobs waiting take turns: an estimate.
func (a *admission) position(uid string) (int, bool) {
	job, ok := a.byUID[uid]
	if !ok {
		return 0, false
	}
	for i, r := range a.jobs[job] {
		if r.Bind.Pod.UID == uid {
			return i * max(1, len(a.order)), true
		}
	}
	return 0, false
}

// each offers take the head of a job's queue, fairest job first: the one
// holding the fewest slots (held counts a pod as soon as take took it),
// then the one served longest ago, then the one that queued first. take
// returns true when it took the pod (it leaves the queue) and false when
// the pod could not be placed: that job is passed over for the rest of the
// round, which ends when every job was passed over or nothing waits. A
// round costs O((pods taken + jobs) × log jobs).
func (a *admission) each(held func(job string) int, take func(Request) bool) {
	if a.n == 0 {
		return
	}
	h := make(jobTurns, 0, len(a.order))
	for i, job := range a.order {
		h = append(h, jobTurn{job: job, held: held(job), served: a.served[job], queued: i})
	}
	heap.Init(&h)
	for h.Len() > 0 {
		t := &h[0]
		req := a.jobs[t.job][0]
		if !take(req) {
			heap.Pop(&h)
			continue
		}
		uid := req.Bind.Pod.UID
		delete(a.byUID, uid)
		delete(a.announce, uid)
		a.n--
		q := a.jobs[t.job][1:]
		if len(q) == 0 {
			a.setJob(t.job, q)
			heap.Pop(&h)
			continue
		}
		a.jobs[t.job] = q
		a.turns++
		a.served[t.job] = a.turns
		t.held, t.served = held(t.job), a.turns
		heap.Fix(&h, 0)
	}
}

// jobTurn is a waiting job's claim to the next slot; jobTurns orders them
// fairest first.
type jobTurn struct {
	job    string
	held   int
	served uint64
	queued int
}

type jobTurns []jobTurn

func (h jobTurns) Len() int { return len(h) }
func (h jobTurns) Less(i, j int) bool {
	if h[i].held != h[j].held {
		return h[i].held < h[j].held
	}
	if h[i].served != h[j].served {
		return h[i].served < h[j].served
	}
	return h[i].queued < h[j].queued
}
func (h jobTurns) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *jobTurns) Push(x any)   { *h = append(*h, x.(jobTurn)) }
func (h *jobTurns) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

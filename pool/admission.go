package pool

// admission is the queue of pods waiting for a slot: first in, first out
// within a trainer job, and round-robin across jobs so that one job's burst
// of thousands does not starve another's single pod.
type admission struct {
	// jobs in the order they first queued; each with its pods in order.
	order []string
	jobs  map[string][]Request
	// byUID: queued pods; announced: pods told they wait.
	byUID    map[string]string // uid → job
	announce map[string]bool
	next     int // round-robin cursor into order
	n        int
	// fresh: pods queued since the last round, not yet told they wait.
	fresh []Request
}

func newAdmission() admission {
	return admission{jobs: map[string][]Request{}, byUID: map[string]string{}, announce: map[string]bool{}}
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
	for i, j := range a.order {
		if j == job {
			a.order = append(a.order[:i:i], a.order[i+1:]...)
			if a.next > i {
				a.next--
			}
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

// position is uid's place if jobs are served round-robin: an estimate.
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

// each offers the head of each job's queue in round-robin order. take
// returns true when it took the pod (it leaves the queue) and false when it
// could not be placed: that job is skipped for this round (its order is
// kept), and when no job's head can be placed the round ends. The turn
// moves only past jobs that placed a pod: rounds that place nothing (a full
// pool) do not change whose turn is next.
func (a *admission) each(take func(Request) bool) {
	blocked := map[string]bool{}
	c := a.next
	for a.n > 0 && len(blocked) < len(a.order) {
		if c >= len(a.order) {
			c = 0
		}
		job := a.order[c]
		if blocked[job] {
			c++
			continue
		}
		req := a.jobs[job][0]
		if !take(req) {
			blocked[job] = true
			c++
			continue
		}
		uid := req.Bind.Pod.UID
		delete(a.byUID, uid)
		delete(a.announce, uid)
		a.n--
		q := a.jobs[job][1:]
		if len(q) == 0 {
			a.setJob(job, q) // removes job: c now points at the following one
			a.next = c
			continue
		}
		a.jobs[job] = q
		c++
		a.next = c
	}
}

package pool

import "container/heap"

// admission is the queue of pods waiting for a slot, shared in two levels.
// First between namespaces: a freed slot goes to the waiting namespace that
// holds the fewest of the pool's slots for its weight (weighted max-min
// fair sharing: the smallest held/weight), so a tenant gets its share
// however many jobs it splits its pods into, and a namespace of weight 2
// holds twice what one of weight 1 holds while both wait. Then between the
// jobs waiting inside that namespace: to the one that holds the fewest
// (max-min), so a job that arrives while another's burst holds the
// namespace's share gets the slots that burst frees until the two hold as
// many, and one job's burst of thousands does not starve another's single
// pod. At either level, among those holding as little, the one served
// longest ago goes first (round-robin), then the one that queued first.
// Within a job, first in, first out.
//
// The namespace is the pod's own (Bind.Pod.Namespace), which a tenant
// cannot choose for a pod of another namespace; the job is a label the pod
// chooses, so it only orders a namespace's own share.
type admission struct {
	// weight is a namespace's weight (≥ 1), read when it starts waiting.
	weight func(ns string) int
	spaces map[string]*space
	// weights sums the weights of the namespaces waiting.
	weights int
	// byUID: queued pods; announce: pods told they wait.
	byUID    map[string]jobKey
	announce map[string]bool
	// turns counts the pods taken; seq numbers namespaces and jobs as they
	// start waiting (ties go to the lower).
	turns, seq uint64
	n          int
	// fresh: pods queued since the last round, not yet told they wait.
	fresh []Request
}

// jobKey is a job within its namespace.
type jobKey struct{ ns, job string }

func keyOf(req Request) jobKey { return jobKey{req.Bind.Pod.Namespace, req.Job} }

// space is one namespace's waiting jobs.
type space struct {
	jobs   map[string]*jobQueue
	n      int    // pods waiting
	weight int    // its share's weight
	served uint64 // the turn it last had a pod taken
	seq    uint64
}

// jobQueue is one job's waiting pods, in order.
type jobQueue struct {
	pods        []Request
	served, seq uint64
}

func newAdmission(weight func(ns string) int) admission {
	return admission{weight: weight, spaces: map[string]*space{}, byUID: map[string]jobKey{}, announce: map[string]bool{}}
}

func (a *admission) len() int { return a.n }

// lenIn is how many pods of namespace ns wait.
func (a *admission) lenIn(ns string) int {
	if s := a.spaces[ns]; s != nil {
		return s.n
	}
	return 0
}

// depths is how many pods wait per namespace (namespaces with none left out).
func (a *admission) depths() map[string]int {
	out := make(map[string]int, len(a.spaces))
	for ns, s := range a.spaces {
		out[ns] = s.n
	}
	return out
}

func (a *admission) has(uid string) bool {
	_, ok := a.byUID[uid]
	return ok
}

// get returns a queued pod's request.
func (a *admission) get(uid string) (Request, bool) {
	jq, i := a.find(uid)
	if jq == nil {
		return Request{}, false
	}
	return jq.pods[i], true
}

// find is the queue uid waits in and its index there (nil: not queued).
func (a *admission) find(uid string) (*jobQueue, int) {
	key, ok := a.byUID[uid]
	if !ok {
		return nil, 0
	}
	jq := a.spaces[key.ns].jobs[key.job]
	for i, r := range jq.pods {
		if r.Bind.Pod.UID == uid {
			return jq, i
		}
	}
	return nil, 0
}

func (a *admission) push(req Request) { a.insert(req, false) }

// pushFront puts a pod back at the head of its job's queue (a bind that a
// node could not take is tried again before newer pods).
func (a *admission) pushFront(req Request) { a.insert(req, true) }

func (a *admission) insert(req Request, front bool) {
	key := keyOf(req)
	s := a.spaces[key.ns]
	if s == nil {
		a.seq++
		s = &space{jobs: map[string]*jobQueue{}, weight: a.weight(key.ns), seq: a.seq}
		a.spaces[key.ns] = s
		a.weights += s.weight
	}
	jq := s.jobs[key.job]
	if jq == nil {
		a.seq++
		jq = &jobQueue{seq: a.seq}
		s.jobs[key.job] = jq
	}
	if front {
		jq.pods = append([]Request{req}, jq.pods...)
	} else {
		jq.pods = append(jq.pods, req)
	}
	a.byUID[req.Bind.Pod.UID] = key
	s.n++
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
	jq, i := a.find(uid)
	if jq == nil {
		return false
	}
	jq.pods = append(jq.pods[:i:i], jq.pods[i+1:]...)
	a.forget(uid)
	return true
}

// forget drops uid, taken out of its job's queue, and the job and the
// namespace when nothing of theirs waits any more (they start afresh when
// they queue again).
func (a *admission) forget(uid string) {
	key := a.byUID[uid]
	delete(a.byUID, uid)
	delete(a.announce, uid)
	a.n--
	s := a.spaces[key.ns]
	s.n--
	if len(s.jobs[key.job].pods) == 0 {
		delete(s.jobs, key.job)
	}
	if s.n == 0 {
		delete(a.spaces, key.ns)
		a.weights -= s.weight
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

// position is uid's place if the namespaces waiting take their shares and
// the jobs in each take turns: an estimate.
func (a *admission) position(uid string) (int, bool) {
	jq, i := a.find(uid)
	if jq == nil {
		return 0, false
	}
	s := a.spaces[a.byUID[uid].ns]
	return i * len(s.jobs) * a.weights / s.weight, true
}

// fairRound is one fair-share round of admission: it offers take the head
// of a job's queue, fairest first: of the namespaces waiting, the one with
// the smallest heldNS/weight (heldNS counts a pod as soon as take took it),
// then the one served longest ago, then the one that queued first; of that
// namespace's jobs, the one holding the fewest, then the one served longest
// ago, then the one that queued first. take returns true when it took the
// pod (it leaves the queue) and false when the pod could not be placed: that
// job is passed over for the rest of the round, and its namespace once all
// of its jobs were. The round ends when every namespace was passed over or
// nothing waits. A round costs O((pods taken + jobs) × log jobs): a
// namespace's jobs are put in a heap when it first comes up.
func (a *admission) fairRound(heldNS func(ns string) int, held func(jobKey) int, take func(Request) bool) {
	if a.n == 0 {
		return
	}
	spaces := make(turns, 0, len(a.spaces))
	for ns, s := range a.spaces {
		spaces = append(spaces, turn{name: ns, held: heldNS(ns), weight: s.weight, served: s.served, seq: s.seq})
	}
	heap.Init(&spaces)
	jobs := map[string]*turns{}
	for spaces.Len() > 0 {
		st := &spaces[0]
		ns := st.name
		s := a.spaces[ns]
		h := jobs[ns]
		if h == nil {
			js := make(turns, 0, len(s.jobs))
			for job, jq := range s.jobs {
				js = append(js, turn{name: job, held: held(jobKey{ns, job}), weight: 1, served: jq.served, seq: jq.seq})
			}
			h = &js
			heap.Init(h)
			jobs[ns] = h
		}
		jt := &(*h)[0]
		key := jobKey{ns, jt.name}
		jq := s.jobs[jt.name]
		req := jq.pods[0]
		if !take(req) {
			heap.Pop(h)
			if h.Len() == 0 {
				heap.Pop(&spaces)
			}
			continue
		}
		a.turns++
		jq.pods = jq.pods[1:]
		a.forget(req.Bind.Pod.UID)
		if len(jq.pods) == 0 {
			heap.Pop(h)
		} else {
			jq.served = a.turns
			jt.held, jt.served = held(key), a.turns
			heap.Fix(h, 0)
		}
		if s.n == 0 {
			heap.Pop(&spaces)
			continue
		}
		s.served = a.turns
		st.held, st.served = heldNS(ns), a.turns
		heap.Fix(&spaces, 0)
	}
}

// turn is a waiting namespace's or job's claim to the next slot; turns
// orders them fairest first.
type turn struct {
	name         string
	held, weight int
	served, seq  uint64
}

type turns []turn

func (h turns) Len() int { return len(h) }
func (h turns) Less(i, j int) bool {
	// held/weight, compared without dividing.
	if l, r := h[i].held*h[j].weight, h[j].held*h[i].weight; l != r {
		return l < r
	}
	if h[i].served != h[j].served {
		return h[i].served < h[j].served
	}
	return h[i].seq < h[j].seq
}
func (h turns) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *turns) Push(x any)   { *h = append(*h, x.(turn)) }
func (h *turns) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

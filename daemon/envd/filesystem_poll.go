package envd

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/sandman-dev/sandman/daemon/envd/spec/filesystem"
)

// pollWatcher collects a watch's events until they are polled.
type pollWatcher struct {
	id    string
	watch *dirWatch
	// done is closed when the collecting goroutine has returned.
	done chan struct{}

	// mu guards the fields below.
	mu     sync.Mutex
	events []*filesystem.FilesystemEvent
	// err ended the watch; it is reported once the events before it are.
	err    error
	polled time.Time
}

func (p *pollWatcher) lastPolled() time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.polled
}

// run collects events until the watch ends.
func (p *pollWatcher) run() {
	defer close(p.done)
	emit := func(ev *filesystem.FilesystemEvent) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.err != nil {
			return
		}
		if len(p.events) >= maxWatcherEvents {
			p.err = connect.NewError(connect.CodeResourceExhausted,
				fmt.Errorf("watcher %s: more than %d events since the last GetWatcherEvents, later ones were dropped: poll more often, then remove this watcher and create a new one", p.id, maxWatcherEvents))
			return
		}
		p.events = append(p.events, ev)
	}
	fail := func(err error) {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.err == nil {
			p.err = err
		}
	}
	for {
		select {
		case err, ok := <-p.watch.fw.Errors:
			if !ok {
				return
			}
			fail(p.watch.failure(err))
			p.watch.close()
		case e, ok := <-p.watch.fw.Events:
			if !ok {
				return
			}
			evs, err := p.watch.handle(e)
			for _, ev := range evs {
				emit(ev)
			}
			if err != nil {
				fail(err)
				p.watch.close()
			}
		}
	}
}

// close ends the watch and waits for the collecting goroutine.
func (p *pollWatcher) close() {
	p.watch.close()
	<-p.done
}

// CreateWatcher starts a watch whose events GetWatcherEvents returns.
func (f *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	u, root, err := f.watchTarget(ctx, req.Msg.GetPath(), req.Msg.GetAllowNetworkMounts())
	if err != nil {
		return nil, err
	}
	if err := f.acquireWatch(); err != nil {
		return nil, err
	}
	w, err := newDirWatch(u, root, req.Msg.GetRecursive(), req.Msg.GetIncludeEntry())
	if err != nil {
		f.releaseWatch()
		return nil, err
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	p := &pollWatcher{id: "w" + hex.EncodeToString(b[:]), watch: w, done: make(chan struct{}), polled: f.s.cfg.Now()}
	go p.run()
	f.watchMu.Lock()
	if f.watchers == nil {
		f.watchers = map[string]*pollWatcher{}
	}
	f.watchers[p.id] = p
	f.open--
	f.watchMu.Unlock()
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: p.id}), nil
}

func (f *filesystemService) watcher(id string) (*pollWatcher, error) {
	f.watchMu.Lock()
	defer f.watchMu.Unlock()
	p, ok := f.watchers[id]
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found (removed, reclaimed after %v unpolled, or from before the daemon restarted)", id, watcherIdle))
	}
	return p, nil
}

// GetWatcherEvents returns the events since the last call; once the watch
// has failed, the error, after the events before it.
func (f *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	p, err := f.watcher(req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.polled = f.s.cfg.Now()
	if len(p.events) == 0 && p.err != nil {
		return nil, p.err
	}
	events := p.events
	p.events = nil
	if events == nil {
		events = []*filesystem.FilesystemEvent{}
	}
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: events}), nil
}

func (f *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	id := req.Msg.GetWatcherId()
	f.watchMu.Lock()
	p, ok := f.watchers[id]
	delete(f.watchers, id)
	f.watchMu.Unlock()
	if !ok {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("watcher %q not found", id))
	}
	p.close()
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}

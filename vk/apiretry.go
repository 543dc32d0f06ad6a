package vk

import (
	"net/http"
	"time"

	utilnet "k8s.io/apimachinery/pkg/util/net"
	"k8s.io/client-go/rest"
)

// waitForAPIServer makes cfg's reads ride out an apiserver outage: a GET
// (list, watch, get) that cannot connect is tried again every interval
// until it connects, its context ends or maxWait passes.
//
// Why: client-go's reflectors back off on failed lists and watches up to
// 30 s, jittered to as much as 60 s, and informer factories give no way to
// shorten that (kubernetes#136943). Without this, after a minute without
// the apiserver the virtual node's informers could take most of another
// minute to notice it is back, and new pods waited that long. With it, the
// reflector's request simply takes as long as the outage and returns as
// soon as the apiserver answers. Writes are not retried here: they fail
// at once and the controllers' rate-limited queues (capped at seconds)
// retry them.
func waitForAPIServer(cfg *rest.Config, interval, maxWait time.Duration) {
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return &waitingTransport{next: rt, interval: interval, maxWait: maxWait}
	})
}

type waitingTransport struct {
	next              http.RoundTripper
	interval, maxWait time.Duration
}

func (t *waitingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodGet {
		return t.next.RoundTrip(req)
	}
	deadline := time.Now().Add(t.maxWait)
	for {
		resp, err := t.next.RoundTrip(req)
		if err == nil || !unreachable(err) || time.Now().After(deadline) {
			return resp, err
		}
		timer := time.NewTimer(t.interval)
		select {
		case <-req.Context().Done():
			timer.Stop()
			return nil, err
		case <-timer.C:
		}
	}
}

// unreachable: nothing answered, so the request did nothing and can be
// sent again.
func unreachable(err error) bool {
	return utilnet.IsConnectionRefused(err) || utilnet.IsConnectionReset(err) || utilnet.IsNoRoutesError(err)
}

// The wrapped transport must still let client-go cancel requests.
var _ utilnet.RoundTripperWrapper = (*waitingTransport)(nil)

// WrappedRoundTripper implements utilnet.RoundTripperWrapper.
func (t *waitingTransport) WrappedRoundTripper() http.RoundTripper { return t.next }

package envd

import (
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

const (
	// keepaliveHeader carries the interval, in seconds, at which a quiet
	// stream (Start, Connect, WatchDir) gets a keepalive event (the SDKs
	// send 50).
	keepaliveHeader = "Keepalive-Ping-Interval"
	// defaultKeepalive applies when the header is missing or malformed.
	defaultKeepalive = 50 * time.Second
	// minKeepalive bounds how often a client may ask for keepalives.
	minKeepalive = 10 * time.Millisecond
	// maxKeepalive bounds how seldom: a stream quiet for longer may be cut
	// by a proxy on the way.
	maxKeepalive = time.Hour
)

// keepaliveInterval reads a stream's keepalive interval from its request
// headers (seconds, fractions allowed).
func keepaliveInterval(h http.Header) time.Duration {
	secs, err := strconv.ParseFloat(strings.TrimSpace(h.Get(keepaliveHeader)), 64)
	if err != nil || !(secs > 0) || math.IsInf(secs, 0) {
		return defaultKeepalive
	}
	secs = min(secs, maxKeepalive.Seconds())
	return max(time.Duration(secs*float64(time.Second)), minKeepalive)
}

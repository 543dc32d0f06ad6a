package daemon

import (
	"sync"
	"time"
)

// outputBuffer keeps the most recent output of a process, up to a byte
// limit, as timestamped chunks with absolute offsets in the combined
// stdout+stderr stream, so readers can re-attach from any offset and follow.
type outputBuffer struct {
	limit int

	// mu guards every field below.
	mu     sync.Mutex
	chunks []outChunk
	start  int64 // offset of the first retained byte
	end    int64 // total bytes written
	size   int   // retained bytes
	closed bool
	// changed is closed and replaced on every write and on close.
	changed chan struct{}
}

type outChunk struct {
	off    int64
	time   time.Time
	stream string
	data   []byte
}

func newOutputBuffer(limit int) *outputBuffer {
	return &outputBuffer{limit: limit, changed: make(chan struct{})}
}

func (b *outputBuffer) write(stream string, p []byte, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.chunks = append(b.chunks, outChunk{off: b.end, time: now, stream: stream, data: p})
	b.end += int64(len(p))
	b.size += len(p)
	for b.size > b.limit && len(b.chunks) > 1 {
		b.size -= len(b.chunks[0].data)
		b.chunks[0] = outChunk{}
		b.chunks = b.chunks[1:]
	}
	if len(b.chunks) > 0 {
		b.start = b.chunks[0].off
	}
	b.notifyLocked()
}

func (b *outputBuffer) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	b.notifyLocked()
}

func (b *outputBuffer) notifyLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// total is the number of bytes written so far.
func (b *outputBuffer) total() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.end
}

// read returns the retained chunks from offset on (the first one cut to
// start at offset), how many bytes before them are no longer retained, the
// next offset to read from, whether the buffer is closed, and a channel that
// is closed when more arrives.
func (b *outputBuffer) read(offset int64) (chunks []outChunk, dropped, next int64, closed bool, changed <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if offset < b.start {
		dropped = b.start - offset
		offset = b.start
	}
	for _, c := range b.chunks {
		cend := c.off + int64(len(c.data))
		if cend <= offset {
			continue
		}
		if c.off < offset {
			c.data = c.data[offset-c.off:]
			c.off = offset
		}
		chunks = append(chunks, c)
	}
	next = max(offset, b.end)
	return chunks, dropped, next, b.closed, b.changed
}

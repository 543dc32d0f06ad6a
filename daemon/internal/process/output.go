package process

import (
	"sync"
	"time"
)

// Output keeps the most recent output of a process, up to a byte limit,
// as timestamped chunks with absolute offsets in the combined
// stdout+stderr stream, so readers can re-attach from any offset and
// follow.
type Output struct {
	limit int

	// mu guards every field below.
	mu     sync.Mutex
	chunks []Chunk
	start  int64 // offset of the first retained byte
	end    int64 // total bytes written
	size   int   // retained bytes
	closed bool
	// changed is closed and replaced on every write and on close.
	changed chan struct{}
}

// Chunk is a piece of a process's output.
type Chunk struct {
	Off    int64 // offset in the combined stream
	Time   time.Time
	Stream string // "stdout" or "stderr"
	Data   []byte
}

func newOutput(limit int) *Output {
	return &Output{limit: limit, changed: make(chan struct{})}
}

func (b *Output) write(stream string, p []byte, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.chunks = append(b.chunks, Chunk{Off: b.end, Time: now, Stream: stream, Data: p})
	b.end += int64(len(p))
	b.size += len(p)
	for b.size > b.limit && len(b.chunks) > 1 {
		b.size -= len(b.chunks[0].Data)
		b.chunks[0] = Chunk{}
		b.chunks = b.chunks[1:]
	}
	if len(b.chunks) > 0 {
		b.start = b.chunks[0].Off
	}
	b.notifyLocked()
}

func (b *Output) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	b.notifyLocked()
}

func (b *Output) notifyLocked() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// Total is the number of bytes written so far.
func (b *Output) Total() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.end
}

// Read returns the retained chunks from offset on (the first one cut to
// start at offset), how many bytes before them are no longer retained, the
// next offset to read from, whether the buffer is closed, and a channel that
// is closed when more arrives.
func (b *Output) Read(offset int64) (chunks []Chunk, dropped, next int64, closed bool, changed <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if offset < b.start {
		dropped = b.start - offset
		offset = b.start
	}
	for _, c := range b.chunks {
		cend := c.Off + int64(len(c.Data))
		if cend <= offset {
			continue
		}
		if c.Off < offset {
			c.Data = c.Data[offset-c.Off:]
			c.Off = offset
		}
		chunks = append(chunks, c)
	}
	next = max(offset, b.end)
	return chunks, dropped, next, b.closed, b.changed
}

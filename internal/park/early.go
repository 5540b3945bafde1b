package park

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Chunks hashed while CRIU writes. A chunked park needs every chunk's
// hash, and the cuts come from the pagemap, which CRIU writes through a
// buffer of one page: it reaches the file in pieces, the last as the
// task's dump ends. The follower of a pages file, whenever it waits for
// CRIU to write more, hashes the chunks that the pagemap written so far
// cuts from the bytes it has hashed whole already, on its own goroutine
// (CRIU keeps its core). A park with no base takes such a hash for a
// chunk at the same offset and of the same size in the file's final cuts,
// and only for a file the follower vouches for ([follower.finish]); it
// hashes the rest once the dump returns (planChunks says why not with a
// base).
//
// Each chunk is read after the follower read the same bytes for the
// file's hash: a rewrite between the two reads, or after both, makes the
// file's hash differ from its final bytes, which the store's
// verification reports, as for any followed file.

// hashedEarly is told the chunks of a pages file hashed early so far
// (a variable: tests wait for it).
var hashedEarly = func(name string, n int) {}

// earlyChunk is a chunk hashed while CRIU wrote its pages file.
type earlyChunk struct {
	size uint64
	addr record.Address
}

const (
	// earlyLook is the least time between two listings of the image
	// directory for the pagemap naming a pages file.
	earlyLook = 5 * time.Millisecond
	// earlyStep is the most bytes of chunks hashed between two looks at
	// the pages file: its growth is hashed first.
	earlyStep = 1 << 20
)

// chunker hashes a followed pages file's chunks early, on the file's
// follower goroutine.
type chunker struct {
	dir     string
	id      uint64 // the file is pages-ID.img
	pagemap string // the path of the pagemap naming it, once found
	looked  time.Time
	parsed  int64 // the pagemap's size when last read
	spans   []span
	next    int // the first span not hashed
	done    map[uint64]earlyChunk
	buf     []byte
}

// span is one chunk's place in a pages file.
type span struct{ at, size uint64 }

// newChunker is the chunker of the followed file path, nil if it is not
// a pages file.
func newChunker(path string) *chunker {
	n, ok := strings.CutPrefix(filepath.Base(path), "pages-")
	if !ok {
		return nil
	}
	n, ok = strings.CutSuffix(n, ".img")
	id, err := strconv.ParseUint(n, 10, 32)
	if !ok || err != nil {
		return nil
	}
	return &chunker{dir: filepath.Dir(path), id: id, done: map[uint64]earlyChunk{}}
}

// step hashes up to earlyStep bytes of chunks that end within the first
// hashed bytes of f, and reports whether it hashed any.
func (c *chunker) step(f *os.File, hashed int64) bool {
	c.refresh()
	first, i := c.next, c.next
	var end uint64 // the spans are back to back: hashed are [first, i)
	for ; i < len(c.spans); i++ {
		e := c.spans[i].at + c.spans[i].size
		if e > uint64(hashed) || (i > first && e-c.spans[first].at > earlyStep) {
			break
		}
		end = e
	}
	if i == first {
		return false
	}
	from := c.spans[c.next].at
	if uint64(cap(c.buf)) < end-from {
		c.buf = make([]byte, end-from)
	}
	b := c.buf[:end-from]
	if _, err := f.ReadAt(b, int64(from)); err != nil {
		c.spans = nil // hashed after the dump instead
		return false
	}
	for _, sp := range c.spans[c.next:i] {
		c.done[sp.at] = earlyChunk{sp.size, record.Sum(b[sp.at-from : sp.at-from+sp.size])}
	}
	c.next = i
	return true
}

// refresh finds the pagemap naming the file and, when it has grown,
// reads the spans its complete entries cut, but the last: the next entry
// may go on with the last run, and so change its last chunk.
func (c *chunker) refresh() {
	if c.pagemap == "" {
		if time.Since(c.looked) < earlyLook {
			return
		}
		c.looked = time.Now()
		c.pagemap = c.find()
		if c.pagemap == "" {
			return
		}
	}
	info, err := os.Stat(c.pagemap)
	if err != nil || info.Size() == c.parsed || info.Size() > maxPagemap {
		return
	}
	b, err := os.ReadFile(c.pagemap)
	if err != nil {
		return
	}
	c.parsed = int64(len(b))
	pm, err := parsePagemapPrefix(b)
	if err != nil || !pm.increasing() {
		c.spans = nil
		return
	}
	runs := pm.spans(ChunkSize)
	if len(runs) > 0 {
		runs = runs[:len(runs)-1]
	}
	spans := make([]span, len(runs))
	var at uint64
	for i, r := range runs {
		spans[i] = span{at, r.bytes}
		at += r.bytes
	}
	// The spans of a longer prefix begin with those of a shorter one.
	if len(spans) < c.next {
		c.next = len(spans)
	}
	c.spans = spans
}

// find is the path of the pagemap whose head names the file, or "".
func (c *chunker) find() string {
	paths, _ := filepath.Glob(filepath.Join(c.dir, "pagemap-*.img"))
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			continue
		}
		head := make([]byte, 64)
		n, _ := f.ReadAt(head, 0)
		f.Close()
		if pm, err := parsePagemapPrefix(head[:n]); err == nil && pm.pages == "pages-"+strconv.FormatUint(c.id, 10)+".img" {
			return p
		}
	}
	return ""
}

// parsePagemapPrefix is parsePagemap of the complete messages at the
// start of b, a pagemap image still being written.
func parsePagemapPrefix(b []byte) (pagemap, error) {
	if len(b) < 8 {
		return pagemap{}, errors.New("no pagemap yet")
	}
	end := 8
	for end+4 <= len(b) {
		n := uint64(binary.LittleEndian.Uint32(b[end:]))
		if n > uint64(len(b)-end-4) {
			break
		}
		end += 4 + int(n)
	}
	return parsePagemap(b[:end])
}

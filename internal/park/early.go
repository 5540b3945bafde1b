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
// cuts from the bytes it has read already, on its own goroutine (CRIU
// keeps its core), then those it would cut if its last run went on: the
// pagemap lags the pages by up to a page of entries, hundreds of MiB. A
// park takes such a hash for a chunk at the same offset and of the same
// size in the file's final cuts, only for a file the follower vouches for
// ([follower.finish]), and hashes the rest once the dump returns; a wrong
// guess is not such a chunk, and costs only its hashing.
//
// Each chunk is read after the follower read the same bytes. With no
// base, the file is stored whole as slab 00 under the follower's hash of
// it: a rewrite between the two reads, or after both, makes that hash
// differ from the file's final bytes, which the store's verification
// reports, as for any followed file. A later park's follower hashes its
// pages files in chunks only (followOptions.later): a chunk it writes into
// a new slab is hashed again from the bytes written, one listed in a slab
// of a base this process did not make is compared with the bytes there,
// and one listed in a slab this process made is listed on the follower's
// hash: a rewrite of those bytes made while the file still grew, which no
// size or time of the file shows (follow.go), would list the base's bytes.
// CRIU writes each image once, by appending.

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
	// guessAt is where the next chunk is in the file if the pagemap's
	// last run goes on past what it says so far, and guessV its
	// virtual address (guessing: there is a guess).
	guessAt, guessV uint64
	guessing        bool
	done            map[uint64]earlyChunk
	buf             []byte
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
// hashed bytes of f, and reports whether it hashed any: the pagemap's
// cuts first, then, once those are hashed, the cuts it would make if its
// last run went on (its guess).
func (c *chunker) step(f *os.File, hashed int64) bool {
	c.refresh()
	for c.next < len(c.spans) { // hashed already as a guess
		sp := c.spans[c.next]
		if e, ok := c.done[sp.at]; !ok || e.size != sp.size {
			break
		}
		c.next++
	}
	var todo []span
	if c.next < len(c.spans) {
		for _, sp := range c.spans[c.next:] {
			if !c.fits(todo, sp, hashed) {
				break
			}
			todo = append(todo, sp)
		}
	} else if c.guessing {
		for at, v := c.guessAt, c.guessV; ; {
			sp := span{at, ChunkSize - v%ChunkSize}
			if !c.fits(todo, sp, hashed) {
				break
			}
			todo = append(todo, sp)
			at, v = at+sp.size, v+sp.size
		}
	}
	if len(todo) == 0 {
		return false
	}
	from, end := todo[0].at, todo[len(todo)-1].at+todo[len(todo)-1].size
	if uint64(cap(c.buf)) < end-from {
		c.buf = make([]byte, end-from)
	}
	b := c.buf[:end-from]
	if _, err := f.ReadAt(b, int64(from)); err != nil {
		c.spans, c.guessing = nil, false // hashed after the dump instead
		return false
	}
	for _, sp := range todo {
		c.done[sp.at] = earlyChunk{sp.size, record.Sum(b[sp.at-from : sp.at-from+sp.size])}
	}
	if c.next < len(c.spans) {
		c.next += len(todo)
	} else {
		c.guessAt, c.guessV = end, c.guessV+end-c.guessAt
	}
	return true
}

// fits is whether sp may join todo, chunks back to back: it ends within
// the first hashed bytes, and todo stays within earlyStep bytes.
func (c *chunker) fits(todo []span, sp span, hashed int64) bool {
	e := sp.at + sp.size
	return e <= uint64(hashed) && (len(todo) == 0 || e-todo[0].at <= earlyStep)
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
		c.spans, c.guessing = nil, false
		return
	}
	runs := pm.spans(ChunkSize)
	if len(runs) == 0 {
		return
	}
	last := runs[len(runs)-1]
	runs = runs[:len(runs)-1]
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
	// The guess goes on from the last cut, or from where it got to if
	// that is on the last run's way.
	if !c.guessing || c.guessAt < at || c.guessV-last.vaddr != c.guessAt-at {
		c.guessAt, c.guessV, c.guessing = at, last.vaddr, true
	}
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

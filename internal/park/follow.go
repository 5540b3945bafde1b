package park

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/internal/treehash"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Following. CRIU writes a memory image as one large pages file, and
// hashing it after the dump was a third of a park. A follower hashes the
// image files while CRIU writes them, each on one goroutine (a
// [treehash.Serial]), so that CRIU keeps a core, and starts their
// writeback as it goes, so that what is left when the dump returns is the
// tail of the hashing and of the writeback.
//
// It relies on the producer writing each file once, from its start to its
// end, as CRIU writes its images. Of any other write it sees what it can:
// a file that shrinks, that is replaced, or whose modification time
// changes after the follower has found it at its final size, is given up,
// and the ingest hashes it as it hashes any file. A rewrite of bytes
// already hashed, made while the file still grows, is beyond what the size
// and times of a file can show: follow only producers that append.
const (
	// followMin is the size from which a file is worth following; smaller
	// ones cost the ingest less than following them costs.
	followMin = 1 << 20
	// followScan is the most often the directory is listed, and
	// followScanMax the least often: between the two, the scanner waits
	// ten times what its last listing took.
	followScan    = 2 * time.Millisecond
	followScanMax = 20 * time.Millisecond
	// followPoll is how long a follower at the end of a file waits before
	// reading again.
	followPoll = time.Millisecond
	// followBuf is the size of each read: few system calls, and a
	// multiple of the hasher's group (treehash.Group).
	followBuf = 1 << 20
	// writebackStep is how many bytes a follower lets accumulate before
	// it starts their writeback.
	writebackStep = 8 << 20
)

// follower hashes the regular files of one directory (not its
// subdirectories) while a producer writes them.
type follower struct {
	dir      string
	opt      followOptions
	ctx      context.Context
	cancel   context.CancelFunc
	returned chan struct{} // closed when the producer has returned
	tell     sync.Once     // closes returned
	scanned  chan struct{} // closed when the scanner has stopped

	mu    sync.Mutex
	files map[string]*followed             // by name, once followed
	early map[string]map[uint64]earlyChunk // by name, set by finish: chunks hashed early of the files it vouches for
	wg    sync.WaitGroup                   // one per followed file
}

// followed is one file's state; but for quietAt, its fields are its
// goroutine's until the follower's WaitGroup is done.
type followed struct {
	path   string
	later  bool                  // a later park's pages file: no writeback, no hash of it whole (followOptions.later)
	chunks map[uint64]earlyChunk // by offset: chunks hashed early (early.go)
	// chunked is closed once chunks is final: from the producer's
	// return, or the tracker's end, no more are hashed.
	chunked chan struct{}
	once    sync.Once // closes chunked
	hashed  int64     // bytes hashed
	early   int64     // of them, hashed before the producer returned
	mtime   time.Time // the file's modification time when first found at its current size
	addr    record.Address
	err     error // why the file was given up
	// quietAt is the size at which the file was last found at its end,
	// or -1 while it grows: for tests, which must know that a file is
	// followed to its end before they rewrite it.
	quietAt atomic.Int64
	// earlyN is the chunks hashed early so far, for tests.
	earlyN atomic.Int64
}

// followOptions are what a follower does besides hashing each file.
type followOptions struct {
	// least is the size from which a file is followed: followMin for
	// a park's image.
	least int64
	// later, if set, names the files of a later chunked park that are
	// likely not stored as they are (its pages files: their chunks are
	// mostly held already). Their writeback is not started, so that the
	// removal of the staged file drops its pages instead of waiting for
	// their write, and they are not hashed whole: only their chunks are
	// (chunks), and finish vouches for them but gives no address.
	later func(name string) bool
	// chunks is whether pages files' chunks are hashed early (early.go).
	chunks bool
}

// follow starts following dir, which need not exist yet. Call exactly
// one of finish, once the producer has returned, or stop.
func follow(ctx context.Context, dir string, opt followOptions) *follower {
	ctx, cancel := context.WithCancel(ctx)
	fl := &follower{
		dir: dir, opt: opt, ctx: ctx, cancel: cancel,
		returned: make(chan struct{}),
		scanned:  make(chan struct{}),
		files:    make(map[string]*followed),
	}
	go fl.scan()
	return fl
}

// scan lists the directory every followScan, or less often if listing it
// takes long (a directory of many small files), and follows each regular
// file once it holds fl.opt.least bytes.
// Once the producer has returned it stops: a file not followed by then is
// left to the ingest.
func (fl *follower) scan() {
	defer close(fl.scanned)
	for {
		start := time.Now()
		ents, _ := os.ReadDir(fl.dir) // absent until the producer makes it
		for _, e := range ents {
			if !e.Type().IsRegular() || fl.following(e.Name()) {
				continue
			}
			info, err := e.Info()
			if err != nil || info.Size() < fl.opt.least {
				continue
			}
			fl.start(e.Name())
		}
		wait := min(max(followScan, 10*time.Since(start)), followScanMax)
		select {
		case <-fl.returned:
			return
		case <-fl.ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

func (fl *follower) following(name string) bool {
	fl.mu.Lock()
	defer fl.mu.Unlock()
	return fl.files[name] != nil
}

func (fl *follower) start(name string) {
	ff := &followed{path: filepath.Join(fl.dir, name), later: fl.opt.later != nil && fl.opt.later(name), chunked: make(chan struct{})}
	ff.quietAt.Store(-1)
	fl.mu.Lock()
	fl.files[name] = ff
	fl.mu.Unlock()
	fl.wg.Go(func() {
		defer ff.setChunks(nil) // if the tracker did not
		ff.err = fl.track(ff)
	})
}

// tracking is told the name of each file a follower opens to hash. (A
// variable: tests wait on it.)
var tracking = func(name string) {}

// tracker is the hashing of one followed file, on its goroutine.
type tracker struct {
	fl          *follower
	ff          *followed
	f           *os.File
	opened      os.FileInfo      // the file as opened: at the end it must still be in place
	h           *treehash.Serial // on this goroutine only: CRIU has the other core
	buf         []byte
	off, queued int64          // bytes hashed; bytes handed to writeback
	final       bool           // the producer has returned: this pass reads to the end
	quiet       bool           // the file was found at its end, of size off, with mtime ff.mtime
	ck          *chunker       // its chunks hashed early, if a pages file of a chunked park
	rest        sync.WaitGroup // the writeback of the rest, started when the producer returns
}

// atEnd is what a tracker finds at the end of what a read found written.
type atEnd int

const (
	grown   atEnd = iota // written since the read: read on
	waiting              // at its end while the producer runs: wait for more
	settled              // read to its end after the producer returned: hashed
)

// track hashes ff's file as it grows, until the producer has returned and
// the file is read to its end.
func (fl *follower) track(ff *followed) error {
	f, err := os.Open(ff.path)
	if err != nil {
		return err
	}
	defer f.Close()
	opened, err := f.Stat()
	if err != nil {
		return err
	}
	tracking(filepath.Base(ff.path))
	t := &tracker{fl: fl, ff: ff, f: f, opened: opened, h: new(treehash.Serial), buf: make([]byte, followBuf)}
	if fl.opt.chunks {
		t.ck = newChunker(ff.path)
	}
	defer t.chunksFinal()
	poll := time.NewTimer(followPoll)
	defer poll.Stop()
	defer t.rest.Wait() // before the Close
	for {
		if err := fl.ctx.Err(); err != nil {
			return err
		}
		if !t.final {
			select {
			case <-fl.returned:
				t.returned()
			default:
			}
		}
		more, err := t.read()
		if err != nil {
			return err
		}
		if more {
			continue
		}
		switch at, err := t.atEnd(); {
		case err != nil:
			return err
		case at == grown:
			continue
		case at == settled:
			return nil
		}
		if t.ck != nil && t.ck.step(t.f, t.off) {
			ff.earlyN.Store(int64(len(t.ck.done)))
			hashedEarly(filepath.Base(ff.path), len(t.ck.done))
			continue // the growth first
		}
		poll.Reset(followPoll)
		select {
		case <-fl.returned:
			// One more pass: whatever the producer wrote before it
			// returned is visible now.
			t.returned()
		case <-poll.C:
		case <-fl.ctx.Done():
			return fl.ctx.Err()
		}
	}
}

// returned marks that the producer has returned, so that this pass reads
// to the end, and starts the writeback of all the rest at once, beside
// the hashing of the tail: the bytes are all written now.
func (t *tracker) returned() {
	t.final, t.ff.early = true, t.off
	t.chunksFinal()
	if t.ff.later {
		return
	}
	from := t.queued
	t.rest.Go(func() { writeback(t.f, from, 0) })
}

// chunksFinal hands the chunks hashed early on to [follower.chunksSoFar]:
// none are hashed once the producer has returned.
func (t *tracker) chunksFinal() {
	if t.ck != nil {
		t.ff.setChunks(t.ck.done)
	}
	t.ff.setChunks(nil)
}

// setChunks makes m the file's chunks hashed early, unless they are set.
func (ff *followed) setChunks(m map[uint64]earlyChunk) {
	ff.once.Do(func() {
		ff.chunks = m
		close(ff.chunked)
	})
}

// read hashes what is written past the bytes hashed, and while the
// producer runs starts the writeback of every writebackStep hashed. more
// says to read again at once: the read found bytes, so it need not be at
// the end; a read that finds nothing more is the end of what is written
// so far, which [tracker.atEnd] judges.
func (t *tracker) read() (more bool, err error) {
	n, err := t.f.ReadAt(t.buf, t.off)
	if n > 0 {
		if !t.ff.later {
			t.h.Write(t.buf[:n])
		}
		t.off += int64(n)
		if t.quiet {
			t.quiet = false
			t.ff.quietAt.Store(-1)
		}
		if !t.final && !t.ff.later && t.off-t.queued >= writebackStep {
			writeback(t.f, t.queued, t.off-t.queued)
			t.queued = t.off
		}
	}
	switch {
	case err == nil:
		return true, nil
	case !errors.Is(err, io.EOF):
		return false, err
	}
	return n > 0, nil // read on until a read finds nothing more
}

// atEnd judges the file at the end of what a read found written: one
// that shrank is given up, one written since the read is read on, and one
// at its end is quiet from now, with the time of the write that brought
// it to its size. After the producer has returned, a quiet file is read
// to its end, and [tracker.settle] judges it.
func (t *tracker) atEnd() (atEnd, error) {
	info, err := t.f.Stat()
	switch {
	case err != nil:
		return 0, err
	case info.Size() < t.off:
		return 0, fmt.Errorf("shrank from %d bytes to %d", t.off, info.Size())
	case info.Size() > t.off:
		return grown, nil
	}
	if !t.quiet {
		// The time of the write that brought it to this size (a write
		// sets the time before it adds bytes). A later time with no more
		// bytes is a write of bytes already hashed.
		t.quiet, t.ff.mtime = true, info.ModTime()
		t.ff.quietAt.Store(t.off)
	}
	if !t.final {
		return waiting, nil
	}
	if err := t.settle(info); err != nil {
		return 0, err
	}
	return settled, nil
}

// settle ends the tracking of a file read to its end after the producer
// returned (info is its state there). It must not have changed since it
// reached this size, and must be the file that was opened, still in
// place: then its hash is ff's.
func (t *tracker) settle(info os.FileInfo) error {
	if !info.ModTime().Equal(t.ff.mtime) {
		return fmt.Errorf("changed at %d bytes without growing", t.off)
	}
	now, err := os.Lstat(t.ff.path)
	if err != nil {
		return err
	}
	if !os.SameFile(t.opened, now) {
		return errors.New("replaced")
	}
	t.ff.hashed, t.ff.addr = t.off, t.h.Sum()
	return nil
}

// writeback starts the writeback of n bytes of f from off (0: to the end),
// so that the ingest's syncfs finds less to write. It is a hint: the
// ingest's syncfs is what makes the bytes durable, and it writes back
// whatever this did not, so an error here changes nothing. (A variable:
// tests see what it is asked.)
var writeback = func(f *os.File, off, n int64) {
	_ = unix.SyncFileRange(int(f.Fd()), off, n, unix.SYNC_FILE_RANGE_WRITE)
}

// followStats says how much following saved.
type followStats struct {
	Files int   // files followed to their end
	Bytes int64 // their size
	Early int64 // of those bytes, how many were hashed before the producer returned
}

// finish tells the follower that the producer has returned, waits for it
// to hash every file it follows to the end, and returns the hashes it
// vouches for, for [store.Store.IngestHashed]. A file it gave up, or whose
// size or modification time differ from those it hashed, is left out, so
// that the ingest hashes it; so is a later park's pages file, hashed in
// chunks only (followOptions.later).
func (fl *follower) finish() (map[string]store.Hashed, followStats) {
	fl.producerReturned()
	<-fl.scanned
	fl.wg.Wait()
	fl.cancel()
	known := make(map[string]store.Hashed, len(fl.files))
	var st followStats
	for name, ff := range fl.files {
		if ff.err != nil {
			continue
		}
		info, err := os.Lstat(ff.path)
		if err != nil || info.Size() != ff.hashed || !info.ModTime().Equal(ff.mtime) {
			continue
		}
		if !ff.later {
			known[name] = store.Hashed{Size: ff.hashed, Address: ff.addr}
		}
		if len(ff.chunks) > 0 {
			if fl.early == nil {
				fl.early = map[string]map[uint64]earlyChunk{}
			}
			fl.early[name] = ff.chunks
		}
		st.Files++
		st.Bytes += ff.hashed
		st.Early += ff.early
	}
	return known, st
}

// stop ends the following without waiting for the producer, and waits
// for the follower's goroutines: the directory may be removed after.
func (fl *follower) stop() {
	fl.cancel()
	<-fl.scanned
	fl.wg.Wait()
}

// producerReturned tells the follower that the producer has returned.
func (fl *follower) producerReturned() { fl.tell.Do(func() { close(fl.returned) }) }

// chunksSoFar are the chunks of name hashed early (early.go), by offset,
// once no more are: call it after producerReturned. They are not vouched
// for before finish says so ([follower.earlyChunks]).
func (fl *follower) chunksSoFar(name string) map[uint64]earlyChunk {
	fl.mu.Lock()
	ff := fl.files[name]
	fl.mu.Unlock()
	if ff == nil {
		return nil
	}
	<-ff.chunked
	return ff.chunks
}

// earlyChunks are the chunks of name hashed early (early.go), by offset,
// if finish vouched for name; else nil.
func (fl *follower) earlyChunks(name string) map[uint64]earlyChunk {
	return fl.early[name]
}

package pageserver

import (
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"unsafe"

	"github.com/runrecordd/runrecordd/pkg/record"
	"golang.org/x/sys/unix"
)

// Reading a verified chunk: once, whole, and hashed before any of its
// pages is sent.

// loadChunk reads verified extent e's file whole and checks it hashes to
// its listed address. A chunk the page cache holds whole (a resume soon
// after its park) is copied from it; any other is read with O_DIRECT
// where the filesystem allows: a chunk is read once, and its pages go to
// the unit, not to the page cache (cold, 512 MiB of chunk files cost
// about a second of processor time through the page cache, on a machine
// where lazy-pages needs the other processor; and O_DIRECT for every
// chunk read a just-parked unit's cached chunks from the disk one by
// one). Raw system calls: an os.File costs a netpoller registration and a
// finalizer per chunk, 32,768 of them for a 512 MiB unit. The bytes are
// in a buffer of bufs: give it back with putBuf once no page of it is to
// be sent.
func loadChunk(e *Extent, dirs *dirs) ([]byte, error) {
	fd, whole, direct, err := openChunk(e, dirs)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return finishChunk(e, fd, whole, 0, direct)
}

// openChunk opens verified extent e's file, checks it is a regular file
// holding e's range (the chunk's own file, or a slab holding it at
// e.Offset), and gives a buffer for its bytes; direct is whether reads
// of it go past the page cache (the cache does not hold it whole, and
// O_DIRECT could be set).
func openChunk(e *Extent, dirs *dirs) (fd int, whole []byte, direct bool, err error) {
	fd, err = dirs.open(e.Path)
	if err != nil {
		return -1, nil, false, fmt.Errorf("pageserver: extent %#x: %s: %w", e.Vaddr, e.Path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, nil, false, fmt.Errorf("pageserver: extent %#x: %w", e.Vaddr, err)
	}
	if st.Size < 0 || uint64(st.Size) < e.Offset+e.Size || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return -1, nil, false, fmt.Errorf("%w: %s holds %d bytes, the chunk at %#x is %d at %d", ErrRefused, e.Path, st.Size, e.Vaddr, e.Size, e.Offset)
	}
	if !cached(fd, e.Offset, e.Size) {
		// Where O_DIRECT cannot be set, the read goes through the cache.
		_, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, unix.O_RDONLY|unix.O_DIRECT)
		direct = err == nil
	}
	return fd, getBuf(int(e.Size)), direct, nil
}

// finishChunk reads the rest of whole, from off on, from fd, checks whole
// hashes to e's address, and returns it; on an error it gives whole back
// to bufs.
func finishChunk(e *Extent, fd int, whole []byte, off int, direct bool) ([]byte, error) {
	for off < len(whole) {
		n, err := unix.Pread(fd, whole[off:], int64(e.Offset)+int64(off))
		if err == unix.EINTR {
			continue
		}
		if err == unix.EINVAL && direct {
			// A filesystem that takes the flag and not the read.
			direct = false
			if _, err = unix.FcntlInt(uintptr(fd), unix.F_SETFL, unix.O_RDONLY); err == nil {
				continue
			}
		}
		if err == nil && n == 0 {
			err = io.ErrUnexpectedEOF
		}
		if err != nil {
			putBuf(whole)
			return nil, fmt.Errorf("pageserver: extent %#x: %s: %w", e.Vaddr, e.Path, err)
		}
		off += n
	}
	if got := record.Sum(whole); got != *e.Verify {
		putBuf(whole)
		return nil, fmt.Errorf("%w: the chunk at %#x hashes to %s, listed as %s", ErrRefused, e.Vaddr, got, *e.Verify)
	}
	return whole, nil
}

// loadChunks loads the chunks of slots as loadChunk does, reading those
// the page cache does not hold in one batch of asynchronous reads on r
// (a read the batch failed or cut short is done again, or finished, with
// pread), and closes each slot's done as soon as its chunk is loaded: a
// fault waits for its own chunk, not for the batch.
func loadChunks(slots []*slot, dirs *dirs, r *aio) {
	type open struct {
		fd     int
		whole  []byte
		direct bool
	}
	opened := make([]open, len(slots))
	finish := func(i, off int) {
		o, sl := opened[i], slots[i]
		if o.whole == nil { // stranded (aio.abandon): read anew
			o.whole, off = getBuf(int(sl.e.Size)), 0
		}
		sl.b, sl.err = finishChunk(sl.e, o.fd, o.whole, off, o.direct)
		unix.Close(o.fd)
		close(sl.done)
	}
	var fds, in []int
	var offs []int64
	var bufs [][]byte
	for i, sl := range slots {
		fd, whole, direct, err := openChunk(sl.e, dirs)
		switch {
		case err != nil:
			sl.err = err
			close(sl.done)
			continue
		case direct:
			fds, bufs, in = append(fds, fd), append(bufs, whole), append(in, i)
			offs = append(offs, int64(sl.e.Offset))
		}
		opened[i] = open{fd: fd, whole: whole, direct: direct}
	}
	for i, o := range opened {
		if o.whole != nil && !o.direct {
			finish(i, 0) // from the page cache
		}
	}
	if len(fds) > 0 {
		r.read(fds, offs, bufs, func(j, count int, err error) {
			i := in[j]
			if bufs[j] == nil {
				opened[i].whole = nil
			}
			if err != nil {
				count = 0
			}
			finish(i, count)
		})
	}
}

// cached reports whether the page cache holds all size bytes at off of
// file fd (cachestat, Linux 6.5; false where it fails).
func cached(fd int, off, size uint64) bool {
	var cs unix.Cachestat_t
	r := unix.CachestatRange{Off: off, Len: size}
	return unix.Cachestat(uint(fd), &r, &cs, 0) == nil && cs.Cache*PageSize >= size
}

// aligned is n bytes starting at a page boundary, as O_DIRECT reads need.
func aligned(n int) []byte {
	b := make([]byte, n+PageSize)
	off := int(uintptr(unsafe.Pointer(&b[0])) & (PageSize - 1))
	if off != 0 {
		off = PageSize - off
	}
	return b[off : off+n : off+n]
}

// bufSize is the size of the chunk buffers bufs recycles: a store
// chunk's (park.ChunkSize; a larger extent gets a buffer of its own).
const bufSize = 16 << 10

// bufs recycles page-aligned chunk buffers: allocated and cleared anew,
// 32,768 of them cost the page server of a 512 MiB unit a tenth of its
// processor time, and as much again in garbage collection.
var bufs = sync.Pool{New: func() any { b := aligned(bufSize); return &b }}

// getBuf is an n-byte page-aligned buffer, from bufs when n fits one.
func getBuf(n int) []byte {
	if n > bufSize {
		return aligned(n)
	}
	return (*bufs.Get().(*[]byte))[:n]
}

// putBuf gives b, from getBuf, back to bufs. Nothing may use b after:
// the next chunk read goes into it.
func putBuf(b []byte) {
	if cap(b) != bufSize {
		return
	}
	b = b[:bufSize]
	bufs.Put(&b)
}

// dirs keeps the directories of chunk files open, so that opening a
// chunk looks up its own name only, not every directory on its path
// again.
type dirs struct {
	mu  sync.Mutex
	fds map[string]int
}

// open opens the file at path read-only, as unix.Open would.
func (d *dirs) open(path string) (int, error) {
	dir, base := filepath.Split(path)
	if dir == "" || base == "" {
		return unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	}
	d.mu.Lock()
	dfd, ok := d.fds[dir]
	if !ok {
		var err error
		if dfd, err = unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0); err != nil {
			d.mu.Unlock()
			return -1, err
		}
		if d.fds == nil {
			d.fds = map[string]int{}
		}
		d.fds[dir] = dfd
	}
	d.mu.Unlock()
	return unix.Openat(dfd, base, unix.O_RDONLY|unix.O_CLOEXEC, 0)
}

// close closes the directories open.
func (d *dirs) close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	for dir, fd := range d.fds {
		unix.Close(fd)
		delete(d.fds, dir)
	}
}

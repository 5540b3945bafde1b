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
	fd, size, err := openFile(e, dirs)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	if err := inRange(e, size); err != nil {
		return nil, err
	}
	direct := !cached(fd, e.Offset, e.Size) && setDirect(fd)
	return finishChunk(e, fd, getBuf(int(e.Size)), 0, direct)
}

// openFile opens verified extent e's file and checks it is a regular
// file; size is its size.
func openFile(e *Extent, dirs *dirs) (fd int, size uint64, err error) {
	fd, err = dirs.open(e.Path)
	if err != nil {
		return -1, 0, fmt.Errorf("pageserver: extent %#x: %s: %w", e.Vaddr, e.Path, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, 0, fmt.Errorf("pageserver: extent %#x: %w", e.Vaddr, err)
	}
	if st.Size < 0 || st.Mode&unix.S_IFMT != unix.S_IFREG {
		unix.Close(fd)
		return -1, 0, fmt.Errorf("%w: %s is not a regular file (the chunk at %#x)", ErrRefused, e.Path, e.Vaddr)
	}
	return fd, uint64(st.Size), nil
}

// inRange checks that a file of size bytes holds extent e's range.
func inRange(e *Extent, size uint64) error {
	if size < e.Offset || size-e.Offset < e.Size {
		return fmt.Errorf("%w: %s holds %d bytes, the chunk at %#x is %d at %d", ErrRefused, e.Path, size, e.Vaddr, e.Size, e.Offset)
	}
	return nil
}

// setDirect makes reads of fd go past the page cache, where the
// filesystem allows (O_DIRECT); it reports whether they do.
func setDirect(fd int) bool {
	_, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, unix.O_RDONLY|unix.O_DIRECT)
	return err == nil
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

// loadChunks loads the chunks of slots as loadChunk does, opening each
// file once, and reading those chunks the page cache does not hold in
// one batch of asynchronous reads on r, the chunks next to each other in
// one file in one read (a read the batch failed or cut short is done
// again, or finished, with pread); it closes each slot's done as soon as
// its chunk is loaded: a fault waits for its own read, not for the batch.
func loadChunks(slots []*slot, dirs *dirs, r *aio) {
	type file struct {
		fd     int
		size   uint64
		err    error
		direct bool // O_DIRECT set: after the cached chunks are read
	}
	files := map[string]*file{}
	defer func() {
		for _, f := range files {
			if f.err == nil {
				unix.Close(f.fd)
			}
		}
	}()
	fail := func(sl *slot, err error) {
		sl.err = err
		close(sl.done)
	}
	// finish reads the rest of sl's chunk into whole from off on, and
	// says it is loaded; fromCache reads all of it through the cache.
	finish := func(sl *slot, fd int, whole []byte, off int, direct bool) {
		sl.b, sl.err = finishChunk(sl.e, fd, whole, off, direct)
		close(sl.done)
	}
	fromCache := func(sl *slot, fd int) { finish(sl, fd, getBuf(int(sl.e.Size)), 0, false) }
	// The chunks the page cache holds are read from it first; the others
	// past it, once their files are set to.
	var past []int
	for i, sl := range slots {
		f := files[sl.e.Path]
		if f == nil {
			f = &file{}
			f.fd, f.size, f.err = openFile(sl.e, dirs)
			files[sl.e.Path] = f
		}
		if f.err != nil {
			fail(sl, f.err)
			continue
		}
		if err := inRange(sl.e, f.size); err != nil {
			fail(sl, err)
			continue
		}
		if cached(f.fd, sl.e.Offset, sl.e.Size) {
			fromCache(sl, f.fd)
			continue
		}
		past = append(past, i)
	}
	var reads []aioRead
	var in [][]int // the slots of each read
	for _, i := range past {
		sl := slots[i]
		f := files[sl.e.Path]
		if !f.direct && !setDirect(f.fd) {
			// Where O_DIRECT cannot be set, the read goes through the cache.
			fromCache(sl, f.fd)
			continue
		}
		f.direct = true
		whole := getBuf(int(sl.e.Size))
		if k := len(reads) - 1; k >= 0 {
			last := slots[in[k][len(in[k])-1]].e
			if reads[k].fd == f.fd && last.Offset+last.Size == sl.e.Offset && sl.e.Offset+sl.e.Size-uint64(reads[k].off) <= maxRead {
				reads[k].bufs = append(reads[k].bufs, whole)
				in[k] = append(in[k], i)
				continue
			}
		}
		reads = append(reads, aioRead{fd: f.fd, off: int64(sl.e.Offset), bufs: [][]byte{whole}})
		in = append(in, []int{i})
	}
	if len(reads) == 0 {
		return
	}
	r.read(reads, func(j, count int, err error) {
		if err != nil {
			count = 0
		}
		for k, i := range in[j] {
			sl, whole := slots[i], reads[j].bufs[k]
			off := min(count, int(sl.e.Size))
			count -= off
			if whole == nil { // stranded (aio.abandon): read anew
				whole, off = getBuf(int(sl.e.Size)), 0
			}
			finish(sl, files[sl.e.Path].fd, whole, off, true)
		}
	})
}

// maxRead bounds one read of chunks next to each other: a fault waits
// for the read holding its chunk, and smaller reads end sooner.
const maxRead = 1 << 20

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

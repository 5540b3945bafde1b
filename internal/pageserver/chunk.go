package pageserver

import (
	"fmt"
	"io"
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
// finalizer per chunk, 32,768 of them for a 512 MiB unit.
func loadChunk(e *Extent) ([]byte, error) {
	fd, err := unix.Open(e.Path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("pageserver: extent %#x: %s: %w", e.Vaddr, e.Path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("pageserver: extent %#x: %w", e.Vaddr, err)
	}
	if st.Size != int64(e.Size) || st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, fmt.Errorf("%w: %s holds %d bytes, the chunk at %#x is %d", ErrRefused, e.Path, st.Size, e.Vaddr, e.Size)
	}
	whole := aligned(int(e.Size))
	direct := false
	if !cached(fd, e.Size) {
		// Where O_DIRECT cannot be set, the read goes through the cache.
		_, err := unix.FcntlInt(uintptr(fd), unix.F_SETFL, unix.O_RDONLY|unix.O_DIRECT)
		direct = err == nil
	}
	for off := 0; off < len(whole); {
		n, err := unix.Pread(fd, whole[off:], int64(off))
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
			return nil, fmt.Errorf("pageserver: extent %#x: %s: %w", e.Vaddr, e.Path, err)
		}
		off += n
	}
	if got := record.Sum(whole); got != *e.Verify {
		return nil, fmt.Errorf("%w: the chunk at %#x hashes to %s, listed as %s", ErrRefused, e.Vaddr, got, *e.Verify)
	}
	return whole, nil
}

// cached reports whether the page cache holds all size bytes of file fd
// (cachestat, Linux 6.5; false where it fails).
func cached(fd int, size uint64) bool {
	var cs unix.Cachestat_t
	r := unix.CachestatRange{Off: 0, Len: size}
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

package pageserver

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Reading chunks past the page cache in batches, with Linux's native
// asynchronous I/O. On a virtual machine each read from the disk is a
// request to the host, and a cold 512 MiB unit has 32,768 chunks of
// 16 KiB. io_submit hands a batch of reads over at once, and io_getevents
// collects their completions together, in less time and processor time
// than one read at a time (BenchmarkLoadChunksCold, docs/benchmarks.md).

// aioBatch is the most chunks one io_submit hands over; the chunks of a
// batch that lie next to each other in one file (a slab) are one read.
const aioBatch = 64

// iocb is the kernel's struct iocb (linux/aio_abi.h) on a little-endian
// machine (amd64, arm64): aio_key before aio_rw_flags.
type iocb struct {
	data   uint64 // aio_data, handed back in the completion
	_      uint32 // aio_key
	_      uint32 // aio_rw_flags
	opcode uint16 // aio_lio_opcode
	_      int16  // aio_reqprio
	fd     uint32 // aio_fildes
	buf    uint64 // aio_buf
	nbytes uint64 // aio_nbytes
	offset int64  // aio_offset
	_      uint64 // aio_reserved2
	_      uint32 // aio_flags
	_      uint32 // aio_resfd
}

// ioEvent is the kernel's struct io_event.
type ioEvent struct {
	data, obj uint64
	res, res2 int64
}

// iocbPread and iocbPreadv are IOCB_CMD_PREAD and IOCB_CMD_PREADV.
const (
	iocbPread  = 0
	iocbPreadv = 7
)

// aio is one AIO context, of aioBatch reads (and buffers) at most.
type aio struct {
	ctx  uintptr
	cbs  [aioBatch]iocb
	ptrs [aioBatch]*iocb
	evs  [aioBatch]ioEvent
	iovs [aioBatch]unix.Iovec
}

// aioRead is one read: from offset off of file fd into bufs, one after
// the other (a contiguous range of the file, scattered in memory).
type aioRead struct {
	fd   int
	off  int64
	bufs [][]byte
}

// newAIO sets up a context, or fails where the kernel has no AIO (or no
// room for another context: fs.aio-max-nr).
func newAIO() (*aio, error) {
	a := &aio{}
	if _, _, e := unix.Syscall(unix.SYS_IO_SETUP, aioBatch, uintptr(unsafe.Pointer(&a.ctx)), 0); e != 0 {
		return nil, fmt.Errorf("pageserver: io_setup: %w", e)
	}
	for i := range a.cbs {
		a.ptrs[i] = &a.cbs[i]
	}
	return a, nil
}

// read does reads rs, with at most aioBatch buffers among them, all at
// once, and calls done(i, count, err) as each read ends, in the order
// they end (count: the bytes read into rs[i].bufs, in order; err: a read
// the caller does again with pread). It returns once every read has
// ended: no read it handed to the kernel writes into a buffer after it
// returned, unless the context could not be ended (then the buffers of
// the reads still out are kept from reuse for good, stranded, and set to
// nil in rs).
func (a *aio) read(rs []aioRead, done func(i, count int, err error)) {
	n, bufs := len(rs), 0
	for _, r := range rs {
		bufs += len(r.bufs)
	}
	if a.ctx == 0 || n > aioBatch || bufs > len(a.iovs) {
		// (More buffers than a.iovs holds would move its iovecs where
		// only the kernel points at them: never asked, read with pread.)
		for i := range n {
			done(i, 0, errAIOGone)
		}
		return
	}
	iovs := a.iovs[:0]
	for i, r := range rs {
		cb := iocb{data: uint64(i), opcode: iocbPread, fd: uint32(r.fd), offset: r.off}
		if len(r.bufs) == 1 {
			cb.buf, cb.nbytes = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(r.bufs[0])))), uint64(len(r.bufs[0]))
		} else {
			first := len(iovs)
			for _, b := range r.bufs {
				iovs = append(iovs, unix.Iovec{Base: unsafe.SliceData(b), Len: uint64(len(b))})
			}
			cb.opcode, cb.buf, cb.nbytes = iocbPreadv, uint64(uintptr(unsafe.Pointer(&iovs[first]))), uint64(len(r.bufs))
		}
		a.cbs[i] = cb
	}
	out := make([]bool, n) // handed to the kernel and not ended
	left := 0
	for sent := 0; sent < n; {
		r, _, e := unix.Syscall(unix.SYS_IO_SUBMIT, a.ctx, uintptr(n-sent), uintptr(unsafe.Pointer(&a.ptrs[sent])))
		switch {
		case e == unix.EINTR:
		case e != 0:
			// The first read not taken failed as a whole: the others
			// are handed over again after it.
			done(sent, 0, fmt.Errorf("pageserver: io_submit: %w", e))
			sent++
		default:
			for i := sent; i < sent+int(r); i++ {
				out[i] = true
			}
			sent += int(r)
			left += int(r)
		}
	}
	for left > 0 {
		got, _, e := unix.Syscall6(unix.SYS_IO_GETEVENTS, a.ctx, 1, uintptr(len(a.evs)), uintptr(unsafe.Pointer(&a.evs[0])), 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			a.abandon(rs, out, e, done)
			break
		}
		for _, ev := range a.evs[:got] {
			i := int(ev.data)
			out[i] = false
			left--
			if ev.res < 0 {
				done(i, 0, fmt.Errorf("pageserver: asynchronous read: %w", unix.Errno(-ev.res)))
			} else {
				done(i, int(ev.res), nil)
			}
		}
	}
	runtime.KeepAlive(rs)
}

// abandon ends the context after io_getevents failed (e; not expected):
// io_destroy returns once the reads still out have ended, and they are
// done again with pread into other buffers. Should io_destroy fail too,
// their buffers are stranded: never used again, nor freed.
func (a *aio) abandon(rs []aioRead, out []bool, e error, done func(i, count int, err error)) {
	_, _, derr := unix.Syscall(unix.SYS_IO_DESTROY, a.ctx, 0, 0)
	a.ctx = 0
	for i, o := range out {
		if !o {
			continue
		}
		if derr != 0 {
			strandedMu.Lock()
			stranded = append(stranded, rs[i].bufs...)
			strandedMu.Unlock()
			for k := range rs[i].bufs {
				rs[i].bufs[k] = nil
			}
		}
		done(i, 0, fmt.Errorf("%w: io_getevents: %w", errAIOGone, e))
	}
}

// stranded are buffers the kernel may still write into (abandon).
var (
	strandedMu sync.Mutex
	stranded   [][]byte
)

// close ends the context, once every read still out on it is done.
func (a *aio) close() {
	if a.ctx != 0 {
		_, _, _ = unix.Syscall(unix.SYS_IO_DESTROY, a.ctx, 0, 0)
		a.ctx = 0
	}
}

// errAIOGone is a read not handed to an AIO context that has ended.
var errAIOGone = errors.New("pageserver: the asynchronous reads' context has ended")

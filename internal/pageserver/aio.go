package pageserver

import (
	"errors"
	"fmt"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Reading chunks past the page cache in batches, with Linux's native
// asynchronous I/O. On this project's virtual machines each read from the
// disk is a request to the host: 16 KiB read with O_DIRECT one at a time
// cost about 30 µs of processor time each, and a cold 512 MiB unit has
// 32,768 such chunks. io_submit hands a batch of reads over at once, and
// io_getevents collects their completions together: opened, read and
// hashed, a cold chunk took 0.41x the time and 0.46x the processor time
// of one read at a time (BenchmarkLoadChunksCold, docs/benchmarks.md).

// aioBatch is the most reads one io_submit hands over.
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
	_      int64  // aio_offset: 0, chunks are read whole
	_      uint64 // aio_reserved2
	_      uint32 // aio_flags
	_      uint32 // aio_resfd
}

// ioEvent is the kernel's struct io_event.
type ioEvent struct {
	data, obj uint64
	res, res2 int64
}

// iocbPread is IOCB_CMD_PREAD.
const iocbPread = 0

// aio is one AIO context, of aioBatch reads at most.
type aio struct {
	ctx  uintptr
	cbs  [aioBatch]iocb
	ptrs [aioBatch]*iocb
	evs  [aioBatch]ioEvent
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

// read reads len(bufs[i]) bytes from the start of file fds[i] into
// bufs[i], all at once, and returns each read's count, or its error (a
// read the caller does again with pread). It returns only once every read
// it handed to the kernel is done: no read writes into a buffer after it
// returned.
func (a *aio) read(fds []int, bufs [][]byte) ([]int, []error) {
	n := len(fds)
	counts, errs := make([]int, n), make([]error, n)
	if a.ctx == 0 {
		for i := range errs {
			errs[i] = errAIOGone
		}
		return counts, errs
	}
	for i := range n {
		a.cbs[i] = iocb{data: uint64(i), opcode: iocbPread, fd: uint32(fds[i]),
			buf: uint64(uintptr(unsafe.Pointer(unsafe.SliceData(bufs[i])))), nbytes: uint64(len(bufs[i]))}
	}
	done := 0
	for sent := 0; sent < n; {
		r, _, e := unix.Syscall(unix.SYS_IO_SUBMIT, a.ctx, uintptr(n-sent), uintptr(unsafe.Pointer(&a.ptrs[sent])))
		switch {
		case e == unix.EINTR:
		case e != 0:
			// The first read not taken failed as a whole: the others
			// are handed over again after it.
			errs[sent] = fmt.Errorf("pageserver: io_submit: %w", e)
			sent++
			done++
		default:
			sent += int(r)
		}
	}
	for done < n {
		got, _, e := unix.Syscall6(unix.SYS_IO_GETEVENTS, a.ctx, 1, uintptr(len(a.evs)), uintptr(unsafe.Pointer(&a.evs[0])), 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 {
			// Not expected. io_destroy returns once the reads still
			// out are done; they are done again with pread, and this
			// context is not used again.
			a.close()
			for i := range errs {
				if errs[i] == nil && counts[i] == 0 {
					errs[i] = fmt.Errorf("%w: io_getevents: %w", errAIOGone, e)
				}
			}
			return counts, errs
		}
		for _, ev := range a.evs[:got] {
			i := int(ev.data)
			if ev.res < 0 {
				errs[i] = fmt.Errorf("pageserver: asynchronous read: %w", unix.Errno(-ev.res))
			} else {
				counts[i] = int(ev.res)
			}
			done++
		}
	}
	return counts, errs
}

// close ends the context, once every read still out on it is done.
func (a *aio) close() {
	if a.ctx != 0 {
		_, _, _ = unix.Syscall(unix.SYS_IO_DESTROY, a.ctx, 0, 0)
		a.ctx = 0
	}
}

// errAIOGone is a read not handed to an AIO context that has ended.
var errAIOGone = errors.New("pageserver: the asynchronous reads' context has ended")

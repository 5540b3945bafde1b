package store

import (
	"context"
	"io"
	"sync"
)

// bufSize is the size of the buffers objects are streamed through: large
// enough that BLAKE3 runs its widest SIMD path and the syscall count is
// small. io.Copy's 32 KiB buffers hashed at a third of the rate. Objects
// known to be small (most are: attestations, receipts, manifests) go
// through a small buffer instead.
const (
	bufSize   = 1 << 20
	smallSize = 64 << 10
)

var (
	bufPool   = sync.Pool{New: func() any { b := make([]byte, bufSize); return &b }}
	smallPool = sync.Pool{New: func() any { b := make([]byte, smallSize); return &b }}
)

// copyBuffered copies src to dst through a pooled buffer, checking ctx
// between reads. (io.Copy would hand the copy to os.File.WriteTo or
// io.Discard's ReadFrom, with buffers of 8 to 32 KiB.) size is what src
// is expected to hold, or -1 if unknown; it only picks the buffer. A
// reader's error other than io.EOF is returned; a *CorruptError among them.
func copyBuffered(ctx context.Context, dst io.Writer, src io.Reader, size int64) (int64, error) {
	pool := &bufPool
	if size >= 0 && size < smallSize {
		pool = &smallPool
	}
	bp := pool.Get().(*[]byte)
	defer pool.Put(bp)
	buf := *bp
	var n int64
	for {
		if err := ctx.Err(); err != nil {
			return n, err
		}
		k, err := io.ReadFull(src, buf)
		if k > 0 {
			if _, werr := dst.Write(buf[:k]); werr != nil {
				return n, werr
			}
			n += int64(k)
		}
		switch err {
		case nil:
		case io.EOF, io.ErrUnexpectedEOF:
			return n, nil
		default:
			return n, err
		}
	}
}

// Package treehash computes BLAKE3 ([record.Sum]: unkeyed, 32 bytes) on
// blake3/guts, in two shapes the store's callers need and blake3.Hasher
// does not give:
//
//   - [Serial] hashes on the calling goroutine only, for the park's
//     follower, which hashes CRIU's images while CRIU dumps them and must
//     leave CRIU its core.
//   - [Halves] hashes a file as the two subtrees under the BLAKE3 root, on
//     two goroutines, for the store's rehash of a snapshot that a resume
//     waits for (store.Rehash): about 5 GB/s on two cores, against about
//     3 GB/s for blake3.Hasher fed 1 MiB at a time (BenchmarkHashFile).
//
// Both give the same address as [record.Sum] over the same bytes; the tests
// hold them to BLAKE3's vectors and to record.Sum at every size that shapes
// the tree.
package treehash

import (
	"context"
	"errors"
	"io"
	"math/bits"
	"sync"

	"lukechampine.com/blake3/guts"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Group is the bytes a [Serial] compresses at once: as many chunks as the
// widest SIMD path takes. Writes of a multiple of it are hashed in place.
const Group = guts.MaxSIMD * guts.ChunkSize

// Serial is BLAKE3 (unkeyed, 32 bytes: [record.Sum]) computed on
// the calling goroutine only. blake3.Hasher spreads each large write over
// goroutines, on every processor; while CRIU dumps, that takes CPU from
// CRIU, which has one of this host's two cores to itself only if the
// follower keeps to the other. It is also faster on one core, without the
// goroutines.
//
// It keeps the Merkle tree's stack as blake3.Hasher does (a chaining
// value per complete subtree, at most one per height, counter holding
// which), but pushes whole groups of chunks, and compresses a group only
// once more input follows it: the last chunk is compressed as the root's.
type Serial struct {
	stack   [64][8]uint32
	counter uint64 // chunks in the stack
	base    uint64 // chunk index of the first chunk (a right subtree's offset)
	buf     [Group]byte
	n       int // bytes in buf
}

// push adds the chaining value of a subtree of 1<<height chunks, merging
// it with the stack's subtrees of its height.
func (h *Serial) push(cv [8]uint32, height int) {
	i := height
	for h.counter&(1<<i) != 0 {
		cv = guts.ChainingValue(guts.ParentNode(h.stack[i], cv, &guts.IV, 0))
		i++
	}
	h.stack[i] = cv
	h.counter += 1 << height
}

func (h *Serial) compress(b *[Group]byte) {
	h.push(guts.ChainingValue(guts.CompressBuffer(b, Group, &guts.IV, h.base+h.counter, 0)), bits.TrailingZeros(guts.MaxSIMD))
}

// Write hashes p. Whole groups are compressed from p in place.
func (h *Serial) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if h.n == Group {
			h.compress(&h.buf)
			h.n = 0
		}
		if h.n == 0 {
			for len(p) > Group {
				h.compress((*[Group]byte)(p[:Group]))
				p = p[Group:]
			}
		}
		k := copy(h.buf[h.n:], p)
		h.n += k
		p = p[k:]
	}
	return n, nil
}

// Sum returns the hash of what was written. It ends the hasher.
func (h *Serial) Sum() record.Address { return rootHash(h.top()) }

// top returns the node at the top of the tree of what was written, not yet
// compressed: the root, or, for a hasher of a subtree, the node whose
// chaining value is the subtree's. It ends the hasher.
func (h *Serial) top() guts.Node {
	rest := h.buf[:h.n]
	for len(rest) > guts.ChunkSize {
		h.push(guts.ChainingValue(guts.CompressChunk(rest[:guts.ChunkSize], &guts.IV, h.base+h.counter, 0)), 0)
		rest = rest[guts.ChunkSize:]
	}
	top := guts.CompressChunk(rest, &guts.IV, h.base+h.counter, 0)
	for i := bits.TrailingZeros64(h.counter); i < bits.Len64(h.counter); i++ {
		if h.counter&(1<<i) != 0 {
			top = guts.ParentNode(h.stack[i], guts.ChainingValue(top), &guts.IV, 0)
		}
	}
	return top
}

func rootHash(root guts.Node) record.Address {
	root.Flags |= guts.FlagRoot
	out := guts.WordsToBytes(guts.CompressNode(root))
	var a record.Address
	copy(a[:], out[:])
	return a
}

// splitAt is where the root of a BLAKE3 tree over size bytes splits: the
// left subtree holds the largest power-of-two number of whole chunks that
// leaves at least one byte to the right. Sizes of one chunk or less do not
// split (0).
func splitAt(size int64) int64 {
	if size <= guts.ChunkSize {
		return 0
	}
	chunks := uint64(size-1) / guts.ChunkSize // whole chunks before the last byte
	return int64(1<<(bits.Len64(chunks)-1)) * guts.ChunkSize
}

// Halves hashes r's size bytes as the root's two subtrees, each on its
// own goroutine with its own reader, and joins them: the same address as
// one hasher over all of them, in about half the time on two cores.
func Halves(ctx context.Context, r io.ReaderAt, size int64) (record.Address, error) {
	left := splitAt(size)
	if left == 0 {
		h := new(Serial)
		if err := feed(ctx, h, io.NewSectionReader(r, 0, size)); err != nil {
			return record.Address{}, err
		}
		return h.Sum(), nil
	}
	var (
		hl, hr = new(Serial), &Serial{base: uint64(left) / guts.ChunkSize}
		errs   [2]error
		wg     sync.WaitGroup
	)
	wg.Add(2)
	go func() { defer wg.Done(); errs[0] = feed(ctx, hl, io.NewSectionReader(r, 0, left)) }()
	go func() { defer wg.Done(); errs[1] = feed(ctx, hr, io.NewSectionReader(r, left, size-left)) }()
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		return record.Address{}, err
	}
	return rootHash(guts.ParentNode(guts.ChainingValue(hl.top()), guts.ChainingValue(hr.top()), &guts.IV, 0)), nil
}

// bufSize is the most feed reads at once: few system calls, and a
// multiple of [Group].
const bufSize = 1 << 20

// bufs holds feed's buffers. A directory of thousands of small files is
// rehashed file by file, two feeds each: a new 1 MiB buffer per feed was
// most of the time spent (clearing it).
var bufs = sync.Pool{New: func() any { b := make([]byte, bufSize); return &b }}

// feed writes everything r holds into h, checking ctx between reads.
func feed(ctx context.Context, h *Serial, r io.Reader) error {
	bp := bufs.Get().(*[]byte)
	defer bufs.Put(bp)
	buf := *bp
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		n, err := r.Read(buf)
		h.Write(buf[:n])
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

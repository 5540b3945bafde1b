package park

import (
	"context"
	"errors"
	"io"
	"math/bits"
	"sync"

	"lukechampine.com/blake3/guts"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// group is the bytes serialHasher compresses at once: as many chunks as
// the widest SIMD path takes.
const group = guts.MaxSIMD * guts.ChunkSize

// serialHasher is BLAKE3 (unkeyed, 32 bytes: [record.Sum]) computed on
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
type serialHasher struct {
	stack   [64][8]uint32
	counter uint64 // chunks in the stack
	base    uint64 // chunk index of the first chunk (a right subtree's offset)
	buf     [group]byte
	n       int // bytes in buf
}

// push adds the chaining value of a subtree of 1<<height chunks, merging
// it with the stack's subtrees of its height.
func (h *serialHasher) push(cv [8]uint32, height int) {
	i := height
	for h.counter&(1<<i) != 0 {
		cv = guts.ChainingValue(guts.ParentNode(h.stack[i], cv, &guts.IV, 0))
		i++
	}
	h.stack[i] = cv
	h.counter += 1 << height
}

func (h *serialHasher) compress(b *[group]byte) {
	h.push(guts.ChainingValue(guts.CompressBuffer(b, group, &guts.IV, h.base+h.counter, 0)), bits.TrailingZeros(guts.MaxSIMD))
}

// Write hashes p. Whole groups are compressed from p in place.
func (h *serialHasher) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		if h.n == group {
			h.compress(&h.buf)
			h.n = 0
		}
		if h.n == 0 {
			for len(p) > group {
				h.compress((*[group]byte)(p[:group]))
				p = p[group:]
			}
		}
		k := copy(h.buf[h.n:], p)
		h.n += k
		p = p[k:]
	}
	return n, nil
}

// Sum returns the hash of what was written. It ends the hasher.
func (h *serialHasher) Sum() record.Address { return rootHash(h.top()) }

// top returns the node at the top of the tree of what was written, not yet
// compressed: the root, or, for a hasher of a subtree, the node whose
// chaining value is the subtree's. It ends the hasher.
func (h *serialHasher) top() guts.Node {
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

// hashHalves hashes r's size bytes as the root's two subtrees, each on its
// own goroutine with its own reader, and joins them: the same address as
// one hasher over all of them, in about half the time on two cores.
func hashHalves(ctx context.Context, r io.ReaderAt, size int64) (record.Address, error) {
	left := splitAt(size)
	if left == 0 {
		h := new(serialHasher)
		if err := feed(ctx, h, io.NewSectionReader(r, 0, size)); err != nil {
			return record.Address{}, err
		}
		return h.Sum(), nil
	}
	var (
		hl, hr = new(serialHasher), &serialHasher{base: uint64(left) / guts.ChunkSize}
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

// feed writes everything r holds into h, checking ctx between reads.
func feed(ctx context.Context, h *serialHasher, r io.Reader) error {
	buf := make([]byte, 1<<20)
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

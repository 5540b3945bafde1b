package park

import (
	"math/bits"

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
	h.push(guts.ChainingValue(guts.CompressBuffer(b, group, &guts.IV, h.counter, 0)), bits.TrailingZeros(guts.MaxSIMD))
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
func (h *serialHasher) Sum() record.Address {
	rest := h.buf[:h.n]
	for len(rest) > guts.ChunkSize {
		h.push(guts.ChainingValue(guts.CompressChunk(rest[:guts.ChunkSize], &guts.IV, h.counter, 0)), 0)
		rest = rest[guts.ChunkSize:]
	}
	root := guts.CompressChunk(rest, &guts.IV, h.counter, 0)
	for i := bits.TrailingZeros64(h.counter); i < bits.Len64(h.counter); i++ {
		if h.counter&(1<<i) != 0 {
			root = guts.ParentNode(h.stack[i], guts.ChainingValue(root), &guts.IV, 0)
		}
	}
	root.Flags |= guts.FlagRoot
	out := guts.WordsToBytes(guts.CompressNode(root))
	var a record.Address
	copy(a[:], out[:])
	return a
}

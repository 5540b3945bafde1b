package main

import (
	"bytes"
	"context"
	"fmt"
	"math/bits"
	"sort"
	"time"

	"lukechampine.com/blake3/guts"

	"github.com/runrecordd/runrecordd/internal/treehash"
	"github.com/runrecordd/runrecordd/pkg/record"
)

const group = guts.MaxSIMD * guts.ChunkSize

// subtreeCV is the chaining value of buf as the subtree of a BLAKE3 tree
// that starts at chunk counter (buf: a power-of-two number of whole
// chunks, at an offset that is a multiple of its size; or the file's last
// piece). One goroutine.
func subtreeCV(buf []byte, counter uint64) [8]uint32 {
	return guts.ChainingValue(subtree(buf, counter))
}

func subtree(buf []byte, counter uint64) guts.Node {
	if len(buf) <= guts.ChunkSize {
		return guts.CompressChunk(buf, &guts.IV, counter, 0)
	}
	if len(buf) <= group && bits.OnesCount(uint(len(buf))) == 1 && len(buf)%guts.ChunkSize == 0 {
		var b [group]byte // as guts.CompressEigentree: the SIMD path, zero-padded
		copy(b[:], buf)
		return guts.CompressBuffer(&b, len(buf), &guts.IV, counter, 0)
	}
	left := splitAt(int64(len(buf)))
	return guts.ParentNode(subtreeCV(buf[:left], counter), subtreeCV(buf[left:], counter+uint64(left)/guts.ChunkSize), &guts.IV, 0)
}

// splitAt is where BLAKE3 splits a tree over size bytes (treehash's).
func splitAt(size int64) int64 {
	chunks := uint64(size-1) / guts.ChunkSize
	return int64(1<<(bits.Len64(chunks)-1)) * guts.ChunkSize
}

// boundCVs are the chaining values of a file's c-byte chunks at their
// offsets: what a chunk list bound to BLAKE3's tree carries.
func boundCVs(p []byte, c int64) [][8]uint32 {
	var cvs [][8]uint32
	for off := int64(0); off < int64(len(p)); off += c {
		cvs = append(cvs, subtreeCV(p[off:min(off+c, int64(len(p)))], uint64(off)/guts.ChunkSize))
	}
	return cvs
}

// rootFromCVs rebuilds the file's address from its chunks' chaining
// values alone: one parent compression per chunk, no byte of the file.
func rootFromCVs(cvs [][8]uint32, size, c int64) record.Address {
	var cv func(lo, hi int64) [8]uint32
	node := func(lo, hi int64) guts.Node {
		s := lo + splitAt(hi-lo)
		return guts.ParentNode(cv(lo, s), cv(s, hi), &guts.IV, 0)
	}
	cv = func(lo, hi int64) [8]uint32 {
		if hi-lo <= c {
			return cvs[lo/c]
		}
		return guts.ChainingValue(node(lo, hi))
	}
	root := node(0, size)
	root.Flags |= guts.FlagRoot
	out := guts.WordsToBytes(guts.CompressNode(root))
	var a record.Address
	copy(a[:], out[:32])
	return a
}

// timed runs f three times and returns the median time and f's result.
func timed[T any](f func() T) (time.Duration, T) {
	var ds []time.Duration
	var r T
	for range 3 {
		t := time.Now()
		r = f()
		ds = append(ds, time.Since(t))
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[1], r
}

func serialSum(p []byte) record.Address {
	var h treehash.Serial
	h.Write(p)
	return h.Sum()
}

// rootOf is BLAKE3 of buf (a chunk's own address) on one goroutine, on
// the SIMD path for every whole group of chunks.
func rootOf(buf []byte) record.Address {
	n := subtree(buf, 0)
	n.Flags |= guts.FlagRoot
	out := guts.WordsToBytes(guts.CompressNode(n))
	var a record.Address
	copy(a[:], out[:32])
	return a
}

func perChunk(p []byte, spans []span) int {
	for _, s := range spans {
		rootOf(p[s.off : s.off+s.n])
	}
	return len(spans)
}

func rate(n int, d time.Duration) string {
	return fmt.Sprintf("%7.1f ms %5.2f GB/s", float64(d)/1e6, float64(n)/d.Seconds()/1e9)
}

// hashing prints question 3's figures on image im's largest pages file,
// held in memory (hashing only, no reads).
func hashing(im *image) error {
	pm := im.maps[0]
	for _, m := range im.maps {
		if m.pagesBytes > pm.pagesBytes {
			pm = m
		}
	}
	p := im.pages[pm.pagesName]
	n := len(p)
	fmt.Printf("\nhashing %s of image 1 (%s, in memory), medians of 3:\n", pm.pagesName, mib(int64(n)))
	d, whole := timed(func() record.Address {
		a, err := treehash.Halves(context.Background(), bytes.NewReader(p), int64(n))
		if err != nil {
			panic(err)
		}
		return a
	})
	fmt.Printf("  whole file, treehash.Halves (2 goroutines: the store's rehash)  %s\n", rate(n, d))
	d, _ = timed(func() record.Address { return serialSum(p) })
	fmt.Printf("  whole file, treehash.Serial (1 goroutine: the park's follower)   %s\n", rate(n, d))
	for _, c := range []*chunker{byName("page-4k"), byName("file-16k"), byName("file-64k"), byName("file-1m"), byName("cdc-16k"), byName("cdc-64k")} {
		spans := c.cut(pm, p)
		for _, s := range spans[:3] {
			if b := p[s.off : s.off+s.n]; rootOf(b) != record.Sum(b) {
				return fmt.Errorf("rootOf is not BLAKE3")
			}
		}
		d, k := timed(func() int { return perChunk(p, spans) })
		fmt.Printf("  %-9s each chunk's own address (1 goroutine, %6d chunks)    %s\n", c.name, k, rate(n, d))
	}
	d, _ = timed(func() int { return len(cdc(p, 64<<10)) })
	fmt.Printf("  cdc-64k cut points alone (gear hash, 1 goroutine)              %s\n", rate(n, d))
	for _, c := range []int64{16 << 10, 64 << 10, 1 << 20} {
		d, cvs := timed(func() [][8]uint32 { return boundCVs(p, c) })
		fmt.Printf("  file-%-4s chaining values at their offsets (1 goroutine)        %s\n", kib(c), rate(n, d))
		d2, root := timed(func() record.Address { return rootFromCVs(cvs, int64(n), c) })
		fmt.Printf("  file-%-4s the file's address from %d chaining values: %.3f ms, equal to treehash's: %v\n", kib(c), len(cvs), float64(d2)/1e6, root == whole)
		if root != whole {
			return fmt.Errorf("the root rebuilt from chaining values is not the file's address")
		}
		d3, _ := timed(func() [8]uint32 { return subtreeCV(p[c:2*c], uint64(c)/guts.ChunkSize) })
		fmt.Printf("  file-%-4s verifying one chunk against its chaining value: %.3f ms\n", kib(c), float64(d3)/1e6)
	}
	for _, name := range []string{"vaddr-16k", "vaddr-64k"} {
		if err := bound(p, pm, byName(name), whole); err != nil {
			return err
		}
	}
	var rest []byte
	for _, b := range im.files {
		rest = append(rest, b...)
	}
	d, _ = timed(func() int {
		for _, b := range im.files {
			serialSum(b)
		}
		return 0
	})
	fmt.Printf("  the eager part: every other file of the image (%d files, %s), each its own address: %.3f ms\n", len(im.files), kib(int64(len(rest))), float64(d)/1e6)
	return nil
}

func byName(name string) *chunker {
	for i := range chunkers {
		if chunkers[i].name == name {
			return &chunkers[i]
		}
	}
	panic(name)
}

// bound prints what a chunk map costs a park for a chunking at page
// offsets (not aligned to BLAKE3's tree): every chunk's own address (its
// object) and the chaining value of every 64 KiB block of the file at its
// offset (what binds the chunks to the file's address), on one goroutine,
// and the file's address folded from those chaining values.
func bound(p []byte, pm pagemap, c *chunker, whole record.Address) error {
	spans := c.cut(pm, p)
	d, cvs := timed(func() [][8]uint32 {
		for _, s := range spans {
			rootOf(p[s.off : s.off+s.n])
		}
		return boundCVs(p, block)
	})
	d2, root := timed(func() record.Address { return rootFromCVs(cvs, int64(len(p)), block) })
	fmt.Printf("  %-9s chunk map: %d chunks, %d blocks of 64 KiB, %s; own addresses + block chaining values (1 goroutine, what a park computes) %s;\n"+
		"            the file's address folded from the blocks' chaining values %.3f ms, equal to treehash's: %v\n",
		c.name, len(spans), len(cvs), kib(listBytes(spans)), rate(len(p), d), float64(d2)/1e6, root == whole)
	if root != whole {
		return fmt.Errorf("the fold is not the file's address")
	}
	return nil
}

package main

import "math/bits"

// span is one chunk of a pages file: [off, off+n).
type span struct{ off, n int64 }

// chunker cuts one process's pages file into chunks.
type chunker struct {
	name string
	cut  func(pm pagemap, pages []byte) []span
}

var chunkers = []chunker{
	{"page-4k", func(pm pagemap, _ []byte) []span { return fixed(pm.pagesBytes, pageSize) }},
	{"file-16k", func(pm pagemap, _ []byte) []span { return fixed(pm.pagesBytes, 16<<10) }},
	{"file-64k", func(pm pagemap, _ []byte) []span { return fixed(pm.pagesBytes, 64<<10) }},
	{"file-1m", func(pm pagemap, _ []byte) []span { return fixed(pm.pagesBytes, 1<<20) }},
	{"entry-64k", func(pm pagemap, _ []byte) []span { return byEntry(pm, 64<<10, false) }},
	{"entry-1m", func(pm pagemap, _ []byte) []span { return byEntry(pm, 1<<20, false) }},
	{"vaddr-8k", func(pm pagemap, _ []byte) []span { return byEntry(pm, 8<<10, true) }},
	{"vaddr-16k", func(pm pagemap, _ []byte) []span { return byEntry(pm, 16<<10, true) }},
	{"vaddr-32k", func(pm pagemap, _ []byte) []span { return byEntry(pm, 32<<10, true) }},
	{"vaddr-64k", func(pm pagemap, _ []byte) []span { return byEntry(pm, 64<<10, true) }},
	{"vaddr-1m", func(pm pagemap, _ []byte) []span { return byEntry(pm, 1<<20, true) }},
	{"cdc-16k", func(_ pagemap, p []byte) []span { return cdc(p, 16<<10) }},
	{"cdc-64k", func(_ pagemap, p []byte) []span { return cdc(p, 64<<10) }},
}

// fixed cuts size bytes every c bytes from the file's start.
func fixed(size, c int64) []span {
	var s []span
	for off := int64(0); off < size; off += c {
		s = append(s, span{off, min(c, size-off)})
	}
	return s
}

// byEntry cuts at every pagemap entry's start and then every c bytes
// counted from the entry's start; or (vaddr) where the virtual address
// crosses a multiple of c and where it jumps (a hole, another mapping),
// not at the starts of entries that go on where the one before ended:
// CRIU splits a run of present pages into entries of at most 256 pages
// counted from the run's start, so those starts move with the run's.
func byEntry(pm pagemap, c int64, vaddr bool) []span {
	var s []span
	ents := pm.entries
	if vaddr {
		ents = runs(ents)
	}
	for _, e := range ents {
		if e.off < 0 {
			continue
		}
		end := e.off + int64(e.pages)*pageSize
		off := e.off
		for off < end {
			next := off + c
			if vaddr {
				v := int64(e.vaddr) + off - e.off
				next = off + c - v%c
			}
			next = min(next, end)
			s = append(s, span{off, next - off})
			off = next
		}
	}
	return s
}

// gear is the gear table of the content-defined chunker: fixed
// pseudo-random words (splitmix64 from 0), so cuts are reproducible.
var gear = func() (g [256]uint64) {
	x := uint64(0)
	for i := range g {
		x += 0x9E3779B97F4A7C15
		z := x
		z = (z ^ z>>30) * 0xBF58476D1CE4E5B9
		z = (z ^ z>>27) * 0x94D049BB133111EB
		g[i] = z ^ z>>31
	}
	return g
}()

// cdc is FastCDC's cut (gear rolling hash, normalized chunking with two
// masks) for an average of avg bytes: no cut before avg/4, a stricter
// mask before avg and a looser one after, a forced cut at 4·avg.
func cdc(p []byte, avg int) []span {
	lg := bits.Len(uint(avg)) - 1
	maskS := uint64(1)<<(lg+2) - 1 // harder: before avg
	maskL := uint64(1)<<(lg-2) - 1 // easier: after avg
	maskS <<= 64 - (lg + 2)        // FastCDC looks at the hash's high bits
	maskL <<= 64 - (lg - 2)
	c := cdcCut{minC: avg / 4, avg: avg, maxC: avg * 4, maskS: maskS, maskL: maskL}
	var s []span
	for start := 0; start < len(p); {
		n := c.point(p[start:])
		s = append(s, span{int64(start), int64(n)})
		start += n
	}
	return s
}

// cdcCut is the chunker's bounds and masks for one average size.
type cdcCut struct {
	minC, avg, maxC int
	maskS, maskL    uint64
}

// point is the length of p's first chunk.
func (c cdcCut) point(p []byte) int {
	if len(p) <= c.minC {
		return len(p)
	}
	n := min(len(p), c.maxC)
	normal := min(n, c.avg)
	var h uint64
	i := c.minC
	for ; i < normal; i++ {
		h = h<<1 + gear[p[i]]
		if h&c.maskS == 0 {
			return i + 1
		}
	}
	for ; i < n; i++ {
		h = h<<1 + gear[p[i]]
		if h&c.maskL == 0 {
			return i + 1
		}
	}
	return n
}

// runs merges entries that continue one another, in memory and in the
// pages file.
func runs(ents []entry) []entry {
	var out []entry
	for _, e := range ents {
		if e.off < 0 {
			continue
		}
		if n := len(out); n > 0 {
			l := &out[n-1]
			if l.vaddr+l.pages*pageSize == e.vaddr && l.off+int64(l.pages)*pageSize == e.off {
				l.pages += e.pages
				continue
			}
		}
		out = append(out, e)
	}
	return out
}

package main

import (
	"encoding/hex"
	"fmt"

	"lukechampine.com/blake3/guts"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// example prints the worked example of docs/chunked-images.md: image b's
// largest pages file as a vaddr-16k chunk map, its first chunks, and what
// it adds to a store holding image a.
func example(a, b *image) {
	c := byName("vaddr-16k")
	pm, p := largest(b)
	spans := c.cut(pm, p)
	whole := record.Sum(p)
	cvs := boundCVs(p, block)
	fmt.Printf("\nworked example: %s of %s as a %s chunk map\n", pm.pagesName, b.dir, c.name)
	fmt.Printf("  file %s, %d bytes, %d pagemap entries; %d chunks, %d blocks; the map %d bytes\n",
		whole, len(p), len(pm.entries), len(spans), len(cvs), listBytes(spans))
	for i, s := range spans[:3] {
		fmt.Printf("  chunk %d: offset %d, length %d, address %s\n", i, s.off, s.n, record.Address(rootOf(p[s.off:s.off+s.n])))
	}
	for i, s := range spans {
		if s.n == 16<<10 {
			fmt.Printf("  the first 16 KiB chunk, %d: offset %d, address %s\n", i, s.off, record.Address(rootOf(p[s.off:s.off+s.n])))
			break
		}
	}
	for i, cv := range cvs[:2] {
		w := guts.WordsToBytes([16]uint32{cv[0], cv[1], cv[2], cv[3], cv[4], cv[5], cv[6], cv[7]})
		fmt.Printf("  block %d (file bytes %d-%d, BLAKE3 chunk counter %d): chaining value %s\n", i, i*block, (i+1)*block-1, i*64, hex.EncodeToString(w[:32]))
	}
	pma, pa := largest(a)
	have := map[key]bool{}
	for _, s := range c.cut(pma, pa) {
		have[sum(pa[s.off:s.off+s.n])] = true
	}
	var n int
	var bytes int64
	for _, s := range spans {
		if k := sum(p[s.off : s.off+s.n]); !have[k] {
			have[k] = true
			n++
			bytes += s.n
		}
	}
	fmt.Printf("  against %s: %d new chunks, %d bytes, + the map %d bytes = %.2f%% of the file\n", a.dir, n, bytes, listBytes(spans), 100*float64(bytes+listBytes(spans))/float64(len(p)))
}

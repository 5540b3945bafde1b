package main

import (
	"fmt"
	"sort"
	"strings"

	"lukechampine.com/blake3"
)

type key [32]byte

func sum(b []byte) key { return blake3.Sum256(b) }

// block is the verification block of a chunk map: the file's BLAKE3
// subtrees of 64 KiB at file offsets, whose chaining values the map lists.
const block = 64 << 10

// listBytes is what the chunk map of spans takes (docs/chunked-images.md):
// 64 bytes of header, per chunk its address and length (36), and per 64 KiB
// of the file the chaining value of that subtree of its BLAKE3 tree (32).
func listBytes(spans []span) int64 {
	var size int64
	for _, s := range spans {
		size = max(size, s.off+s.n)
	}
	return 64 + 36*int64(len(spans)) + 32*((size+block-1)/block)
}

// imageBytes is every file of the image.
func (im *image) bytes() (all, pages int64) {
	for _, b := range im.files {
		all += int64(len(b))
	}
	for _, b := range im.pages {
		all += int64(len(b))
		pages += int64(len(b))
	}
	return all, pages
}

// layout prints how the memory of b lies against a, process by process:
// pagemap entries kept, pages kept/changed/added/dropped by virtual
// address, and pages whose offset in the pages file moved.
func layout(a, b *image) {
	for _, pb := range b.maps {
		var pa *pagemap
		for i := range a.maps {
			if a.maps[i].name == pb.name {
				pa = &a.maps[i]
			}
		}
		if pa == nil {
			fmt.Printf("  %s: new process\n", pb.name)
			continue
		}
		ents := map[entry]bool{}
		for _, e := range pa.entries {
			ents[entry{e.vaddr, e.pages, e.flags, 0}] = true
		}
		same := 0
		for _, e := range pb.entries {
			if ents[entry{e.vaddr, e.pages, e.flags, 0}] {
				same++
			}
		}
		va, vb := pageIndex(*pa, a.pages[pa.pagesName]), pageIndex(pb, b.pages[pb.pagesName])
		var kept, changed, added, moved int
		for v, pb := range vb {
			p, ok := va[v]
			switch {
			case !ok:
				added++
			case p.h != pb.h:
				changed++
			default:
				kept++
			}
			if ok && p.off != pb.off {
				moved++
			}
		}
		dropped := 0
		for v := range va {
			if _, ok := vb[v]; !ok {
				dropped++
			}
		}
		fmt.Printf("  %s: entries %d -> %d (%d identical); pages %d -> %d: %d same, %d changed (%.2f%%), %d added, %d dropped; %d at another offset in %s\n",
			pb.name, len(pa.entries), len(pb.entries), same, len(va), len(vb), kept, changed, 100*float64(changed)/float64(len(vb)), added, dropped, moved, pb.pagesName)
	}
}

type pageAt struct {
	h   key
	off int64
}

func pageIndex(pm pagemap, pages []byte) map[uint64]pageAt {
	m := map[uint64]pageAt{}
	for _, e := range pm.entries {
		if e.off < 0 {
			continue
		}
		for i := int64(0); i < int64(e.pages); i++ {
			off := e.off + i*pageSize
			m[e.vaddr+uint64(i)*pageSize] = pageAt{sum(pages[off : off+pageSize]), off}
		}
	}
	return m
}

// storeSim is a store that has taken in the images so far in one form.
type storeSim struct {
	has    map[key]bool
	stored int64
}

// add stores the objects (address, size) not yet stored and returns the
// bytes that took.
func (s *storeSim) add(objs map[key]int64) int64 {
	var n int64
	for k, sz := range objs {
		if !s.has[k] {
			s.has[k] = true
			n += sz
		}
	}
	s.stored += n
	return n
}

// objects is what image im stores in chunking c ("whole": today's form,
// a file per object): every file but the pages files whole, each pages
// file as its chunks and its chunk list. It returns them, the chunk count
// and the list bytes.
func objects(im *image, c *chunker) (map[key]int64, int, int, int64) {
	objs := map[key]int64{}
	uniq := map[key]bool{}
	for _, b := range im.files {
		objs[sum(b)] = int64(len(b))
	}
	var chunks int
	var list int64
	for _, pm := range im.maps {
		p := im.pages[pm.pagesName]
		if c == nil {
			objs[sum(p)] = int64(len(p))
			continue
		}
		spans := c.cut(pm, p)
		var lb strings.Builder
		for _, s := range spans {
			k := sum(p[s.off : s.off+s.n])
			objs[k] = s.n
			uniq[k] = true
			lb.Write(k[:])
		}
		chunks += len(spans)
		lsz := listBytes(spans)
		list += lsz
		objs[sum([]byte(lb.String()+pm.pagesName))] = lsz // a new list whenever a chunk changed
	}
	return objs, chunks, len(uniq), list
}

// stores prints, per chunking, what each image adds to a store holding
// the ones before it, and what they all take against one image.
func stores(ims []*image) {
	one, _ := ims[0].bytes()
	fmt.Printf("\nstored bytes, per chunking; image 1 is %s; new = what the image adds to a store holding the images before it\n", mib(one))
	fmt.Printf("%-10s %8s %8s %9s", "chunking", "chunks", "unique", "list")
	for i := 1; i < len(ims); i++ {
		fmt.Printf(" %16s", fmt.Sprintf("new %d (%%)", i+1))
	}
	fmt.Printf(" %10s %8s\n", "all", "all/one")
	cs := append([]*chunker{nil}, ptrs(chunkers)...)
	for _, c := range cs {
		name := "whole"
		if c != nil {
			name = c.name
		}
		s := &storeSim{has: map[key]bool{}}
		var line []string
		var chunks, uniq int
		var list int64
		for i, im := range ims {
			objs, n, u, l := objects(im, c)
			added := s.add(objs)
			if i == 0 {
				chunks, uniq, list = n, u, l
				if c == nil {
					chunks, uniq = len(im.maps), len(im.maps)
				}
				continue
			}
			all, _ := im.bytes()
			line = append(line, fmt.Sprintf("%s (%5.2f)", mib(added), 100*float64(added)/float64(all)))
		}
		fmt.Printf("%-10s %8d %8d %9s", name, chunks, uniq, kib(list))
		for _, l := range line {
			fmt.Printf(" %16s", l)
		}
		fmt.Printf(" %10s %8.3f\n", mib(s.stored), float64(s.stored)/float64(one))
	}
	fmt.Println("chunks, unique, list: image 1's pages files (unique: distinct chunk addresses); list: the chunk lists' bytes (the chunk maps: 36 bytes per chunk and 32 per 64 KiB of the file)")
}

func ptrs(cs []chunker) []*chunker {
	p := make([]*chunker, len(cs))
	for i := range cs {
		p[i] = &cs[i]
	}
	return p
}

func mib(n int64) string { return fmt.Sprintf("%.2fM", float64(n)/(1<<20)) }
func kib(n int64) string { return fmt.Sprintf("%.1fK", float64(n)/(1<<10)) }

// describe prints an image's files and pagemaps.
func describe(i int, im *image) {
	all, pages := im.bytes()
	names := make([]string, 0, len(im.files))
	for n := range im.files {
		names = append(names, n)
	}
	sort.Strings(names)
	fmt.Printf("image %d: %s: %d files, %s (pages files %s, the rest %s)\n", i+1, im.dir, len(im.files)+len(im.pages), mib(all), mib(pages), kib(all-pages))
	for _, pm := range im.maps {
		present, other := 0, 0
		for _, e := range pm.entries {
			if e.off >= 0 {
				present++
			} else {
				other++
			}
		}
		fmt.Printf("  %s: %d entries (%d with pages in %s, %d without), %s\n", pm.name, len(pm.entries), present, pm.pagesName, other, mib(pm.pagesBytes))
	}
}

package park

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// CRIU image magics (criu/include/magic.h): every image but the raw
// pages-*.img starts with the image set's magic and its own.
const (
	imgCommonMagic = 0x54564319
	pagemapMagic   = 0x56084025
	pageSize       = 4096
	pePresent      = 1 << 2 // pagemap_entry.flags: the pages are in pages-N.img
	peLazy         = 1 << 1 // pagemap_entry.flags: the pages may be restored lazily
	// maxPagemap is the largest pagemap image read: a pagemap entry is
	// at most about 40 bytes, and CRIU writes one per 256 pages at most
	// every 1 MiB of present memory, so 64 MiB is far past any unit.
	maxPagemap = 64 << 20
	// maxPagemaps is the most pagemap images (one per process) an image
	// may have; maxPagemap bounds them all together too.
	maxPagemaps = 4096
)

// run is present pages at consecutive virtual addresses, consecutive in
// the pages file too.
type run struct {
	vaddr, bytes uint64
}

// pagemap is one process's pagemap-PID.img: the pages file it describes
// and the runs of present pages, in the order they are in that file.
type pagemap struct {
	name  string // pagemap-ID.img
	pages string // pages-N.img
	runs  []run
	eager []run  // the present pages not marked lazy, in file order
	bytes uint64 // the pages file's size: the runs' sum
}

// readPagemaps reads every pagemap-*.img of a CRIU image directory: at
// most maxPagemaps of them, of at most maxPagemap bytes in all (an
// imported image is hostile: one pagemap listed under a thousand names
// would be parsed, and held, a thousand times).
func readPagemaps(dir string) ([]pagemap, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "pagemap-*.img"))
	if err != nil {
		return nil, err
	}
	files := make([]imageFile, len(paths))
	for i, p := range paths {
		files[i] = imageFile{filepath.Base(p), p}
	}
	return readPagemapFiles(files)
}

// imageFile is an image of a CRIU image directory: its name there, and
// the file that holds it.
type imageFile struct{ name, path string }

// readPagemapFiles is readPagemaps of the pagemap images files names.
func readPagemapFiles(files []imageFile) ([]pagemap, error) {
	if len(files) > maxPagemaps {
		return nil, fmt.Errorf("%d pagemap images, the limit is %d", len(files), maxPagemaps)
	}
	var total int64
	for _, f := range files {
		info, err := os.Lstat(f.path)
		if err != nil {
			return nil, err
		}
		if total += info.Size(); total > maxPagemap {
			return nil, fmt.Errorf("pagemap images of more than %d bytes in all", maxPagemap)
		}
	}
	var out []pagemap
	for _, f := range files {
		b, err := os.ReadFile(f.path)
		if err != nil {
			return nil, err
		}
		pm, err := parsePagemap(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.name, err)
		}
		pm.name = f.name
		out = append(out, pm)
	}
	return out, nil
}

// parsePagemap decodes a pagemap image (images/pagemap.proto of CRIU 4):
// the magics, then length-prefixed messages, pagemap_head{pages_id} and
// one pagemap_entry{vaddr, compat_nr_pages, in_parent, flags, nr_pages}
// per run of pages, in the order of their bytes in the pages file. A
// field the proto declares uint32 is refused past 2^32-1 ([uint32Field]).
func parsePagemap(b []byte) (pagemap, error) {
	var pm pagemap
	if len(b) < 8 || binary.LittleEndian.Uint32(b) != imgCommonMagic || binary.LittleEndian.Uint32(b[4:]) != pagemapMagic {
		return pm, errors.New("not a pagemap image")
	}
	b = b[8:]
	first := true
	for len(b) > 0 {
		if len(b) < 4 || uint64(binary.LittleEndian.Uint32(b)) > uint64(len(b)-4) {
			return pm, errors.New("truncated message")
		}
		n := binary.LittleEndian.Uint32(b)
		fields, err := protoFields(b[4 : 4+n])
		if err != nil {
			return pm, err
		}
		b = b[4+n:]
		if first {
			if err := uint32Field("pages_id", fields[1]); err != nil {
				return pm, err
			}
			pm.pages = fmt.Sprintf("pages-%d.img", fields[1])
			first = false
			continue
		}
		if err := pm.add(fields); err != nil {
			return pm, err
		}
	}
	if first {
		return pm, errors.New("no pagemap head")
	}
	return pm, nil
}

// add adds a pagemap_entry's present pages.
func (pm *pagemap) add(fields map[int]uint64) error {
	for _, f := range []struct {
		name string
		n    int
	}{{"compat_nr_pages", 2}, {"flags", 4}} {
		if err := uint32Field(f.name, fields[f.n]); err != nil {
			return err
		}
	}
	vaddr, pages, flags := fields[1], fields[2], fields[4]
	if n, ok := fields[5]; ok {
		pages = n
	}
	if _, ok := fields[4]; !ok && fields[3] == 0 {
		flags = pePresent
	}
	if flags&pePresent == 0 || pages == 0 {
		return nil
	}
	if pages > 1<<40 || vaddr%pageSize != 0 || vaddr+pages*pageSize < vaddr {
		return fmt.Errorf("entry at %#x of %d pages: not a range of the address space", vaddr, pages)
	}
	sz := pages * pageSize
	if pm.bytes+sz < pm.bytes {
		return errors.New("more pages than a file holds")
	}
	pm.bytes += sz
	if flags&peLazy == 0 {
		pm.eager = appendRun(pm.eager, run{vaddr, sz})
	}
	pm.runs = appendRun(pm.runs, run{vaddr, sz})
	return nil
}

// uint32Field refuses a value past 2^32-1 of a field images/pagemap.proto
// declares uint32: CRIU (protobuf-c) keeps the low 32 bits of its varint,
// so the value read here would not be the one CRIU reads (pages_id
// 2^32+1 would name pages-4294967297.img, and CRIU reads pages-1.img).
func uint32Field(name string, v uint64) error {
	if v > math.MaxUint32 {
		return fmt.Errorf("%s %d: past uint32", name, v)
	}
	return nil
}

// appendRun appends r to runs, joined to the last one when it follows it.
func appendRun(runs []run, r run) []run {
	if n := len(runs); n > 0 && runs[n-1].vaddr+runs[n-1].bytes == r.vaddr {
		runs[n-1].bytes += r.bytes
		return runs
	}
	return append(runs, r)
}

// task is the process id a task's pagemap is named by (pagemap-ID.img,
// ID in canonical decimal, as CRIU names it), false for any other
// pagemap (a shared memory segment's, pagemap-shmem-ID.img) and for a
// name CRIU does not give: pagemap-007.img is not task 7's, which CRIU
// reads from pagemap-7.img.
func (pm pagemap) task() (uint64, bool) {
	id, ok := strings.CutPrefix(pm.name, "pagemap-")
	if !ok {
		return 0, false
	}
	id, ok = strings.CutSuffix(id, ".img")
	n, err := strconv.ParseUint(id, 10, 64)
	return n, ok && err == nil && n > 0 && strconv.FormatUint(n, 10) == id
}

// hasLazy is whether any of pm's present pages is marked lazy.
func (pm pagemap) hasLazy() bool {
	var eager uint64
	for _, r := range pm.eager {
		eager += r.bytes
	}
	return eager < pm.bytes
}

// isTask is whether pm is a task's pagemap.
func (pm pagemap) isTask() bool {
	_, ok := pm.task()
	return ok
}

// eagerIn reports whether any page of [v, v+size) is eager.
func (pm pagemap) eagerIn(v, size uint64) bool {
	for _, r := range pm.eager {
		if r.vaddr < v+size && v < r.vaddr+r.bytes {
			return true
		}
	}
	return false
}

// protoFields decodes a message of varint fields only (what pagemap
// messages hold) into field number → value.
func protoFields(b []byte) (map[int]uint64, error) {
	f := map[int]uint64{}
	for len(b) > 0 {
		key, n := binary.Uvarint(b)
		if n <= 0 || key&7 != 0 || key>>3 > 1<<20 {
			return nil, errors.New("not a message of varint fields")
		}
		b = b[n:]
		v, m := binary.Uvarint(b)
		if m <= 0 {
			return nil, errors.New("bad varint")
		}
		b = b[m:]
		f[int(key>>3)] = v
	}
	return f, nil
}

// increasing reports whether the runs go up in address: then the pages
// file's order is the addresses' order, the order chunks are listed in.
func (pm pagemap) increasing() bool {
	for i := 1; i < len(pm.runs); i++ {
		if pm.runs[i].vaddr < pm.runs[i-1].vaddr+pm.runs[i-1].bytes {
			return false
		}
	}
	return true
}

// spans cuts the runs where the address crosses a multiple of size:
// vaddr-16k at 16 KiB (docs/chunked-images.md, "Which chunking").
func (pm pagemap) spans(size uint64) []run {
	var out []run
	for _, r := range pm.runs {
		v, end := r.vaddr, r.vaddr+r.bytes
		for v < end {
			n := min(size-v%size, end-v)
			out = append(out, run{v, n})
			v += n
		}
	}
	return out
}

// isPages is whether name is a CRIU pages image's (pages-N.img).
func isPages(name string) bool {
	return strings.HasPrefix(name, "pages-") && strings.HasSuffix(name, ".img")
}

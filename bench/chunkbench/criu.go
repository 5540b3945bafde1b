package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// CRIU image magics (criu/include/magic.h): every image but the raw
// pages-*.img starts with the image set's magic and its own.
const (
	imgCommonMagic = 0x54564319
	pagemapMagic   = 0x56084025
	pageSize       = 4096
	pePresent      = 1 << 2 // pagemap_entry.flags: the pages are in pages-N.img
)

// entry is one pagemap_entry (images/pagemap.proto of CRIU 4.2.1) and where its pages
// are in the pages file (off -1: none, in a parent image or zero).
type entry struct {
	vaddr uint64
	pages uint64
	flags uint32
	off   int64
}

// pagemap is one process's pagemap-PID.img and its pages file.
type pagemap struct {
	name, pagesName string
	entries         []entry
	pagesBytes      int64
}

// image is one CRIU image directory.
type image struct {
	dir   string
	files map[string][]byte // every file but the pages files
	maps  []pagemap
	pages map[string][]byte // pages-N.img by name
}

func readImage(dir string) (*image, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	im := &image{dir: dir, files: map[string][]byte{}, pages: map[string][]byte{}}
	for _, e := range ents {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name()))
		if err != nil {
			return nil, err
		}
		if strings.HasPrefix(e.Name(), "pages-") {
			im.pages[e.Name()] = b
		} else {
			im.files[e.Name()] = b
		}
	}
	names := make([]string, 0)
	for n := range im.files {
		if strings.HasPrefix(n, "pagemap-") {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		pm, err := parsePagemap(n, im.files[n])
		if err != nil {
			return nil, fmt.Errorf("%s: %w", n, err)
		}
		if int64(len(im.pages[pm.pagesName])) != pm.pagesBytes {
			return nil, fmt.Errorf("%s: %s holds %d bytes, the pagemap lists %d", n, pm.pagesName, len(im.pages[pm.pagesName]), pm.pagesBytes)
		}
		im.maps = append(im.maps, pm)
	}
	if len(im.maps) == 0 {
		return nil, fmt.Errorf("%s: no pagemap-*.img", dir)
	}
	return im, nil
}

func parsePagemap(name string, b []byte) (pagemap, error) {
	pm := pagemap{name: name}
	if len(b) < 8 || binary.LittleEndian.Uint32(b) != imgCommonMagic || binary.LittleEndian.Uint32(b[4:]) != pagemapMagic {
		return pm, errors.New("not a pagemap image")
	}
	b = b[8:]
	first := true
	for len(b) > 0 {
		if len(b) < 4 || int(binary.LittleEndian.Uint32(b)) > len(b)-4 {
			return pm, errors.New("truncated entry")
		}
		n := binary.LittleEndian.Uint32(b)
		msg := b[4 : 4+n]
		b = b[4+n:]
		fields, err := protoFields(msg)
		if err != nil {
			return pm, err
		}
		if first { // pagemap_head { pages_id = 1 }
			pm.pagesName = fmt.Sprintf("pages-%d.img", fields[1])
			first = false
			continue
		}
		// CRIU 4 counts the pages in nr_pages (5, 64 bits) and leaves
		// compat_nr_pages (2) zero when they do not fit 32 bits or always.
		e := entry{vaddr: fields[1], pages: fields[2], flags: uint32(fields[4]), off: -1}
		if n, ok := fields[5]; ok {
			e.pages = n
		}
		if _, ok := fields[4]; !ok && fields[3] == 0 {
			e.flags = pePresent
		}
		if e.flags&pePresent != 0 {
			e.off = pm.pagesBytes
			pm.pagesBytes += int64(e.pages) * pageSize
		}
		pm.entries = append(pm.entries, e)
	}
	return pm, nil
}

// protoFields decodes a message of varint fields only (what pagemap
// messages hold) into field number → value.
func protoFields(b []byte) (map[int]uint64, error) {
	f := map[int]uint64{}
	for len(b) > 0 {
		key, n := binary.Uvarint(b)
		if n <= 0 || key&7 != 0 {
			return nil, errors.New("not a varint field")
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

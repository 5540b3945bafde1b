package bundle_test

import (
	"bytes"
	"context"
	"errors"
	"math"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/bundletest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// watched is a staging area that says whether a staging directory was
// made: a bundle refused from its header alone must make none.
type watched struct {
	bundle.Staging
	dirs int
}

func (w *watched) StagingDir(prefix string) (string, error) {
	w.dirs++
	return w.Staging.StagingDir(prefix)
}

// tiny is n distinct objects of 3 bytes each: what a pack carries at 4
// bytes of stream apiece, and each a file (an inode and a block) staged.
func tiny(n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = []byte{byte(i >> 16), byte(i >> 8), byte(i)}
	}
	return out
}

// A format-2 bundle of many tiny packed objects costs its stream 4 bytes
// an object but the staging area a file each (an inode, a disk block, a
// few hundred bytes of the importer's memory): bundle.json's object count
// is capped (bundle.Limits.Objects) and refused from the header, before a
// staging directory is made, and a count that would overflow the pack's
// bound is refused the same way.
func TestPackAttackObjectCount(t *testing.T) {
	b := forge(t, nil)
	junk := tiny(4096)
	for name, c := range map[string]struct {
		objects int
		lim     bundle.Limits
	}{
		"over the default count": {objects: 1<<21 + 1},
		"over a count limit":     {objects: len(b.Objects) + len(junk), lim: bundle.Limits{Objects: len(b.Objects) + 1}},
		"a count that overflows": {objects: math.MaxInt64/3 + 1},
	} {
		t.Run(name, func(t *testing.T) {
			st, dir := mustStore(t)
			w := &watched{Staging: st}
			raw := tar2(b, func(h *bundle.Header) {
				h.Objects = c.objects
				h.Bytes += int64(3 * len(junk))
			}, bundletest.Member("pack/0", packOf(append(all(b), junk...)...)))
			o := opts()
			o.Limits = c.lim
			_, err := bundle.Stage(context.Background(), w, bytes.NewReader(raw), o)
			if !errors.Is(err, bundle.ErrLimit) || !strings.Contains(err.Error(), "objects") {
				t.Fatalf("got %v, want %v naming the objects", err, bundle.ErrLimit)
			}
			if w.dirs != 0 {
				t.Fatalf("a staging directory made for a bundle refused by its header")
			}
			if n, size := objects(t, dir); n != 0 || size != 0 {
				t.Fatalf("refused bundle left %d objects, %d bytes", n, size)
			}
		})
	}
}

// With a host's count limit set as high as an int goes, a count near it
// still bounds a pack as declared, without the bound overflowing: the
// pack is read, and the bundle refused for carrying fewer objects than
// it declares (not for a pack larger than a negative bound).
func TestPackAttackCountOverflow(t *testing.T) {
	b := forge(t, nil)
	st, dir := mustStore(t)
	raw := tar2(b, func(h *bundle.Header) { h.Objects = math.MaxInt64/3 + 1 }, bundletest.Member("pack/0", packOf(all(b)...)))
	o := opts()
	o.Limits = bundle.Limits{Objects: math.MaxInt}
	_, err := bundle.Stage(context.Background(), st, bytes.NewReader(raw), o)
	if !errors.Is(err, bundle.ErrMalformed) || !strings.Contains(err.Error(), "bundle.json declares 3074457345618258603 of") {
		t.Fatalf("got %v, want %v for fewer objects than declared", err, bundle.ErrMalformed)
	}
	if n, size := objects(t, dir); n != 0 || size != 0 {
		t.Fatalf("refused bundle left %d objects, %d bytes", n, size)
	}
}

// With a host's byte limit as high as an int64 goes, bundle.json may
// declare that many bytes: the bound on a pack (the bytes left, plus a
// length for each object left) must not overflow into refusing a pack
// that fits it.
func TestPackAttackBytesOverflow(t *testing.T) {
	b := forge(t, nil)
	st, dir := mustStore(t)
	raw := tar2(b, func(h *bundle.Header) { h.Bytes = math.MaxInt64 }, bundletest.Member("pack/0", packOf(all(b)...)))
	o := opts()
	o.Limits = bundle.Limits{Total: math.MaxInt64}
	_, err := bundle.Stage(context.Background(), st, bytes.NewReader(raw), o)
	if !errors.Is(err, bundle.ErrMalformed) || !strings.Contains(err.Error(), "bundle.json declares") || strings.Contains(err.Error(), "could take") {
		t.Fatalf("got %v, want %v for fewer bytes than declared", err, bundle.ErrMalformed)
	}
	if n, size := objects(t, dir); n != 0 || size != 0 {
		t.Fatalf("refused bundle left %d objects, %d bytes", n, size)
	}
}

// Staging a member allocates in proportion to the member, not a fixed
// buffer of its largest possible size: a bundle of many tiny members (a
// pack per 3-byte object, or an objects/ member per one) would otherwise
// make the importer allocate and clear a megabyte (or 64 KiB) for each
// kilobyte of stream. Measured as bytes allocated (runtime.MemStats), not
// time.
func TestPackAttackAllocPerMember(t *testing.T) {
	b := forge(t, nil)
	const n = 500
	junk := tiny(2 * n)
	ms := [][]byte{bundletest.Member("pack/0", packOf(all(b)...))}
	for i, o := range junk[:n] {
		ms = append(ms, bundletest.Member("pack/"+strconv.Itoa(i+1), packOf(o)))
	}
	for _, o := range junk[n:] {
		ms = append(ms, bundletest.Member(bundletest.Name(record.Sum(o)), o))
	}
	raw := tar2(b, func(h *bundle.Header) { h.Objects += len(junk); h.Bytes += int64(3 * len(junk)) }, ms...)
	st, _ := mustStore(t)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := bundle.Stage(context.Background(), st, bytes.NewReader(raw), opts())
	runtime.ReadMemStats(&after)
	if !errors.Is(err, bundle.ErrMalformed) || !strings.Contains(err.Error(), "not one the record reaches") {
		t.Fatalf("got %v, want the junk refused as unreached", err)
	}
	per := (after.TotalAlloc - before.TotalAlloc) / uint64(len(ms))
	t.Logf("%d bytes allocated per member", per)
	if per > 16<<10 {
		t.Fatalf("%d bytes allocated per member of at most 516 bytes of stream", per)
	}
}

// ImportStored makes the decision Import makes of a bundle of the same
// run: a record reaching more objects than the count limit is refused
// there as a bundle carrying them would be, and the store is unchanged.
func TestPackAttackStoredObjectCount(t *testing.T) {
	st, dir := mustStore(t)
	b := forge(t, nil)
	lim := bundle.Limits{Objects: len(b.Objects) - 1}
	o := iopts()
	o.Limits = lim
	_, err := bundle.Stage(context.Background(), st, bytes.NewReader(b.Tar(nil)), bundle.Options{Limits: lim})
	if !errors.Is(err, bundle.ErrLimit) {
		t.Fatalf("bundle: got %v, want %v", err, bundle.ErrLimit)
	}
	putAll(t, st, b.Objects)
	before := stateOf(t, st, dir)
	_, err = bundle.ImportStored(context.Background(), st, b.Record, bundle.StoredOptions{ImportOptions: o, Run: "forged"})
	if !errors.Is(err, bundle.ErrLimit) || !strings.Contains(err.Error(), "objects") {
		t.Fatalf("stored: got %v, want %v", err, bundle.ErrLimit)
	}
	if after := stateOf(t, st, dir); after != before {
		t.Fatalf("refused import changed the store:\n%s\nwas\n%s", after, before)
	}
}

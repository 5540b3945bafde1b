package store

import (
	"errors"
	"os"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/record"
)

func TestHandOffAndExtend(t *testing.T) {
	src, dst := mustStore(t), mustStore(t)
	head, dir := parkedRun(t, src, "r", map[string]string{"pages.img": "pages"})
	rec, err := src.Record("r")
	if err != nil {
		t.Fatal(err)
	}
	// Executing runs are not handed off; a stale head is refused.
	if err := src.HandOff("r", record.Genesis(unitOf("r"))); !errors.Is(err, ErrHeadMoved) {
		t.Fatalf("hand off at a stale head: %v", err)
	}
	if err := src.HandOff("r", head); err != nil {
		t.Fatal(err)
	}
	if h, ok, _ := src.HandedOff("r"); !ok || h.Head != head || h.Copy {
		t.Fatalf("handed off %v as %+v", ok, h)
	}
	// The second host continues the run: it resumes and parks again.
	copyObjects(t, src, dst)
	if err := dst.Import("r", rec); err != nil {
		t.Fatal(err)
	}
	// A second copy of the genesis, under any id, is refused.
	if err := dst.Import("r2", rec); !errors.Is(err, ErrGenesisHeld) {
		t.Fatalf("second import of one genesis: %v", err)
	}
	if _, err := dst.Create("r3", rec.Unit(), rec.Grants()); !errors.Is(err, ErrGenesisHeld) {
		t.Fatalf("create over a held genesis: %v", err)
	}
	h := mustAppend(t, dst, "r", rec.Head(), record.Resumption(record.ImageSnapshot(dir, nil), 5, record.Estimated))
	att := put(t, dst, "attestation 2", put(t, dst, "receipt 2"), put(t, dst, "journal 2"))
	h = mustAppend(t, dst, "r", h, record.Execution(att, nil))
	man := put(t, dst, "manifest 2")
	mustAppend(t, dst, "r", h, record.Suspension(record.ImageSnapshot(dir, nil), man))
	longer, err := dst.Record("r")
	if err != nil {
		t.Fatal(err)
	}
	// A record that is not an extension is refused, and leaves the run as
	// it was: another run's record, then the source's own shorter one.
	parkedRun(t, dst, "other", map[string]string{"x": "y"})
	otherRec, _ := dst.Record("other")
	copyObjects(t, dst, src)
	if _, err := src.Extend("r", otherRec, false, false); !errors.Is(err, ErrNotExtension) {
		t.Fatalf("extend with another run's record: %v", err)
	}
	if _, ok, _ := src.HandedOff("r"); !ok {
		t.Fatal("a refused extension took the handoff back")
	}
	// Taking back the very record handed off needs the operator's word.
	if _, err := src.Extend("r", rec, false, false); !errors.Is(err, ErrNotExtension) {
		t.Fatalf("extend with the record handed off: %v", err)
	}
	// What comes back is whole intervals: the handed-off record and a
	// Closed segment (no attestation) is refused.
	closed := record.New(rec.Unit(), rec.Grants())
	for i := range rec.Len() {
		if _, err := closed.Append(rec.Segment(i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := closed.Append(record.Closure("forged")); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Extend("r", closed, false, false); !errors.Is(err, ErrNotExtension) {
		t.Fatalf("extend with an unattested closure: %v", err)
	}
	if got, err := src.Extend("r", longer, false, false); err != nil || got != longer.Head() {
		t.Fatalf("extend: %s, %v", got, err)
	}
	if _, ok, _ := src.HandedOff("r"); ok {
		t.Fatal("still handed off after the extension came back")
	}
	back, err := src.Record("r")
	if err != nil || back.Head() != longer.Head() || back.Len() != longer.Len() {
		t.Fatalf("record after extension: %v", err)
	}
	// Not handed off any more: another extension is ErrRunExists.
	if _, err := src.Extend("r", longer, false, false); !errors.Is(err, ErrRunExists) {
		t.Fatalf("extend of a run not handed off: %v", err)
	}
	if _, err := src.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// copyObjects puts every object of from into to, with its refs.
func copyObjects(t *testing.T, from, to *Store) {
	t.Helper()
	var all []record.Address
	if err := from.walkObjects(func(a record.Address, _ string, _ os.FileInfo) error {
		all = append(all, a)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Refs first: repeat until every object is in.
	for len(all) > 0 {
		var later []record.Address
		for _, a := range all {
			refs, _ := from.Refs(a)
			if to.haveAll(refs) != nil {
				later = append(later, a)
				continue
			}
			b, err := from.ReadAll(a)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := to.PutBytes(b, refs...); err != nil {
				t.Fatal(err)
			}
		}
		if len(later) == len(all) {
			t.Fatal("objects whose refs never arrive")
		}
		all = later
	}
}

func TestImportedTime(t *testing.T) {
	src, dst := mustStore(t), mustStore(t)
	parkedRun(t, src, "r", map[string]string{"a": "b"})
	if r, _ := src.RetentionOf("r"); !r.Imported.IsZero() {
		t.Fatalf("a run started here has an import time: %+v", r)
	}
	rec, _ := src.Record("r")
	copyObjects(t, src, dst)
	before := time.Now()
	if err := dst.Import("r", rec); err != nil {
		t.Fatal(err)
	}
	if r, _ := dst.RetentionOf("r"); r.Imported.Before(before.Add(-time.Second)) {
		t.Fatalf("import time %v, imported after %v", r.Imported, before)
	}
}

func TestCopiesStayCopies(t *testing.T) {
	src, dst := mustStore(t), mustStore(t)
	head, _ := parkedRun(t, src, "r", map[string]string{"a": "b"})
	rec, _ := src.Record("r")
	copyObjects(t, src, dst)
	if err := dst.ImportAs("r", rec, true); err != nil {
		t.Fatal(err)
	}
	h, ok, err := dst.HandedOff("r")
	if err != nil || !ok || !h.Copy || h.Head != head {
		t.Fatalf("a copy is held as %+v %v %v", h, ok, err)
	}
	// Handing it off does not make it the run: it stays a copy.
	if err := dst.HandOff("r", head); err != nil {
		t.Fatal(err)
	}
	if h, _, _ := dst.HandedOff("r"); !h.Copy {
		t.Fatal("a handoff of a copy made it the run")
	}
	// Nor does a reclaim.
	if err := dst.Reclaim("r", head); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := dst.HandedOff("r"); !ok {
		t.Fatal("a reclaim took a copy for the run")
	}
	// The same record, as a real handoff (reclaim: no new segments), makes
	// it the run here.
	if _, err := dst.Extend("r", rec, false, true); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := dst.HandedOff("r"); ok {
		t.Fatal("still held elsewhere after the handoff came")
	}
	// A handoff at a stale head is not reclaimed by an old export.
	if err := src.HandOff("r", head); err != nil {
		t.Fatal(err)
	}
	if err := src.Reclaim("r", record.Sum([]byte("other head"))); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := src.HandedOff("r"); !ok {
		t.Fatal("a reclaim at another head cleared the handoff")
	}
}

// A run held elsewhere is released after the retention time like a closed
// one (it is resumed elsewhere); a bundle bringing it back brings every
// snapshot again, and it is no longer released.
func TestHandedOffRunReleased(t *testing.T) {
	src, dst := mustStore(t), mustStore(t)
	head, _ := parkedRun(t, src, "r", map[string]string{"pages.img": "pages"})
	rec, _ := src.Record("r")
	if err := src.HandOff("r", head); err != nil {
		t.Fatal(err)
	}
	if ex, _ := src.Expired(time.Now().Add(-time.Hour)); len(ex) != 0 {
		t.Fatalf("expired before its time: %v", ex)
	}
	ex, _ := src.Expired(time.Now().Add(time.Second))
	if len(ex) != 1 || ex[0] != "r" {
		t.Fatalf("expired %v, want [r]", ex)
	}
	if err := src.Release("r"); err != nil {
		t.Fatal(err)
	}
	if r, _ := src.RetentionOf("r"); r.Released.IsZero() {
		t.Fatal("not released")
	}
	if _, err := src.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
	// It comes back, extended by another host.
	copyObjects(t, src, dst)
	if err := dst.Import("r", rec); err != nil {
		t.Fatal(err)
	}
	dir := rec.Segment(1).Snapshot.Root
	h := mustAppend(t, dst, "r", rec.Head(), record.Resumption(record.ImageSnapshot(*dir, nil), 5, record.Estimated))
	h = mustAppend(t, dst, "r", h, record.Execution(put(t, dst, "attestation 2"), nil))
	mustAppend(t, dst, "r", h, record.Suspension(record.ImageSnapshot(*dir, nil), put(t, dst, "manifest 2")))
	longer, _ := dst.Record("r")
	copyObjects(t, dst, src)
	if _, err := src.Extend("r", longer, false, false); err != nil {
		t.Fatal(err)
	}
	if r, _ := src.RetentionOf("r"); !r.Released.IsZero() {
		t.Fatal("still released after the run came back")
	}
}

// TakeOver makes a copy, or a run handed off, this host's again at the head
// it holds, and refuses any other head; a run held here already is left.
func TestTakeOver(t *testing.T) {
	src, dst := mustStore(t), mustStore(t)
	head, _ := parkedRun(t, src, "r", map[string]string{"pages.img": "pages"})
	rec, err := src.Record("r")
	if err != nil {
		t.Fatal(err)
	}
	copyObjects(t, src, dst)
	if err := dst.ImportAs("r", rec, true); err != nil {
		t.Fatal(err)
	}
	if err := dst.TakeOver("r", record.Genesis(unitOf("r"))); !errors.Is(err, ErrHeadMoved) {
		t.Fatalf("take over at another head: %v", err)
	}
	if _, ok, _ := dst.HandedOff("r"); !ok {
		t.Fatal("a refused take-over dropped the copy mark")
	}
	if err := dst.TakeOver("r", head); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := dst.HandedOff("r"); ok {
		t.Fatal("taken over, and still held elsewhere")
	}
	if err := dst.TakeOver("r", head); err != nil {
		t.Fatalf("a run held here already: %v", err)
	}
	if err := src.HandOff("r", head); err != nil {
		t.Fatal(err)
	}
	if err := src.TakeOver("r", head); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := src.HandedOff("r"); ok {
		t.Fatal("a handoff taken over is still there")
	}
	if err := src.TakeOver("nosuch", head); !errors.Is(err, ErrNoRun) {
		t.Fatalf("no such run: %v", err)
	}
}

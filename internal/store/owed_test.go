package store

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// owedRun stores on dst the run r parked on src, every object but slabs:
// the listing declares every ref but them, and the run owes them.
func owedRun(t *testing.T, src, dst *Store, listing record.Address, slabs ...record.Address) *record.Record {
	t.Helper()
	rec, err := src.Record("r")
	if err != nil {
		t.Fatal(err)
	}
	var all []record.Address
	for _, a := range src.appendRecordRefs(nil, rec, false) {
		all = append(all, a)
		refs, _ := src.Refs(a)
		all = append(all, refs...)
	}
	for len(all) > 0 {
		var later []record.Address
		for _, a := range all {
			if slices.Contains(slabs, a) || dst.Has(a) {
				continue
			}
			refs, _ := src.Refs(a)
			refs = slices.DeleteFunc(refs, func(r record.Address) bool { return slices.Contains(slabs, r) })
			if dst.haveAll(refs) != nil {
				later = append(later, a)
				continue
			}
			b, err := src.ReadAll(a)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := dst.PutBytes(b, refs...); err != nil {
				t.Fatal(err)
			}
		}
		if len(later) == len(all) {
			t.Fatal("objects whose refs never arrive")
		}
		all = later
	}
	if err := dst.ImportOwing("r", rec, false, Owing{Source: record.Sum([]byte("source")), Slabs: slabs, Listings: []record.Address{listing}}); err != nil {
		t.Fatal(err)
	}
	return rec
}

// An owed slab is stored with the run, survives a restart, is kept by a
// collection once adopted and before it is settled (seen failing first,
// without the owed roots: the slab collected), the owing run handed
// onward is not released (seen failing first: it expired), and settling
// the slab declares the listing's refs in full and ends the owing.
func TestOwedSlabs(t *testing.T) {
	src, dst := mustStore(t), mustStore(t)
	_, dir := parkedRun(t, src, "r", map[string]string{"core.img": "core", "pages.img.slabs/00": "slab zero", "pages.img.slabs/01": "slab one"})
	es, err := src.Listing(dir)
	if err != nil {
		t.Fatal(err)
	}
	var slab record.Address
	for _, e := range es {
		if e.Name == "pages.img.slabs/01" {
			slab = e.Address
		}
	}
	rec := owedRun(t, src, dst, dir, slab)
	dst = mustReopen(t, dst)
	o, ok, err := dst.Owed("r")
	if err != nil || !ok || !slices.Equal(o.Slabs, []record.Address{slab}) || !slices.Equal(o.Listings, []record.Address{dir}) || o.Source != record.Sum([]byte("source")) {
		t.Fatalf("owed: %+v %v %v", o, ok, err)
	}
	if runs, _ := dst.OwedRuns(); !slices.Equal(runs, []string{"r"}) {
		t.Fatalf("owed runs %v", runs)
	}
	if _, err := dst.Check(t.Context()); err != nil {
		t.Fatalf("check of an owed run: %v", err)
	}
	if err := dst.Settle(t.Context(), "r", slab); !errors.Is(err, ErrMissingObject) {
		t.Fatalf("settle of a slab not stored: %v", err)
	}
	// Adopted (here: put, no refs, old), not settled yet.
	if _, err := dst.PutBytes([]byte("slab one")); err != nil {
		t.Fatal(err)
	}
	if err := chtimes(dst.Path(slab), time.Now().Add(-time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.GC(t.Context(), time.Minute); err != nil {
		t.Fatal(err)
	}
	if !dst.Has(slab) {
		t.Fatal("a collection took an owed slab")
	}
	// Handed onward before it is paid: retention keeps what it owes for.
	if err := dst.HandOff("r", rec.Head()); err != nil {
		t.Fatal(err)
	}
	if ex, _ := dst.Expired(time.Now().Add(time.Second)); len(ex) != 0 {
		t.Fatalf("an owing run expired: %v", ex)
	}
	if err := dst.Release("r"); err == nil {
		t.Fatal("released an owing run")
	}
	if err := dst.Discharge("r"); !errors.Is(err, ErrOwed) || !errors.Is(dst.Owes("r"), ErrOwed) {
		t.Fatalf("discharge of a run owing a slab: %v", err)
	}
	if err := dst.Settle(t.Context(), "r", slab); err != nil {
		t.Fatal(err)
	}
	if o, ok, _ := dst.Owed("r"); !ok || len(o.Slabs) != 0 || dst.Owes("r") != nil {
		t.Fatalf("owing once settled: %+v %v", o, ok)
	}
	if err := dst.Discharge("r"); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := dst.Owed("r"); ok {
		t.Fatal("still owing once discharged")
	}
	if refs, _ := dst.Refs(dir); !slices.Contains(refs, slab) {
		t.Fatalf("the listing's refs %v lack the settled slab", refs)
	}
	if err := dst.Settle(t.Context(), "r", slab); err != nil {
		t.Fatalf("settling again: %v", err)
	}
	if _, err := dst.GC(t.Context(), time.Minute); err != nil || !dst.Has(slab) {
		t.Fatalf("gc after settling: %v, slab held %v", err, dst.Has(slab))
	}
	if _, err := dst.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// A slab settled while another of its listing's is still owed stays
// reachable: a collection between the two arrivals keeps it, and the
// second settles (seen failing first: the first slab collected, the
// second's settle missing it).
func TestSettledSlabKeptWhileListingOwes(t *testing.T) {
	src, dst := mustStore(t), mustStore(t)
	files := map[string]string{"core.img": "core", "pages.img.slabs/00": "slab zero", "pages.img.slabs/01": "slab one"}
	_, dir := parkedRun(t, src, "r", files)
	es, err := src.Listing(dir)
	if err != nil {
		t.Fatal(err)
	}
	slab := map[string]record.Address{}
	for _, e := range es {
		slab[e.Name] = e.Address
	}
	s0, s1 := slab["pages.img.slabs/00"], slab["pages.img.slabs/01"]
	owedRun(t, src, dst, dir, s0, s1)
	if _, err := dst.PutBytes([]byte(files["pages.img.slabs/00"])); err != nil {
		t.Fatal(err)
	}
	if err := dst.Settle(t.Context(), "r", s0); err != nil {
		t.Fatal(err)
	}
	if err := chtimes(dst.Path(s0), time.Now().Add(-2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.GC(t.Context(), time.Hour); err != nil {
		t.Fatal(err)
	}
	if !dst.Has(s0) {
		t.Fatal("a collection took a settled slab its listing still needs")
	}
	if _, err := dst.PutBytes([]byte(files["pages.img.slabs/01"])); err != nil {
		t.Fatal(err)
	}
	if err := dst.Settle(t.Context(), "r", s1); err != nil {
		t.Fatal(err)
	}
	if err := dst.Owes("r"); err != nil {
		t.Fatal(err)
	}
	if refs, _ := dst.Refs(dir); !slices.Contains(refs, s0) || !slices.Contains(refs, s1) {
		t.Fatalf("the listing's refs %v lack a settled slab", refs)
	}
	if _, err := dst.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// A hold keeps a handed-off run's snapshots from retention until the
// hold is dropped by its target at its head, and survives a restart.
func TestHoldKeepsHandedOffRun(t *testing.T) {
	s := mustStore(t)
	head, _ := parkedRun(t, s, "r", map[string]string{"pages.img": "pages"})
	if err := s.HandOff("r", head); err != nil {
		t.Fatal(err)
	}
	target := record.Sum([]byte("target"))
	if err := s.AddHold("r", target, head); err != nil {
		t.Fatal(err)
	}
	if err := s.AddHold("nope", target, head); !errors.Is(err, ErrNoRun) {
		t.Fatalf("hold of no run: %v", err)
	}
	s = mustReopen(t, s)
	if h, ok, err := s.HoldOf("r"); err != nil || !ok || h.Target != target || h.Head != head || time.Since(h.Since) > time.Minute {
		t.Fatalf("hold %+v %v %v", h, ok, err)
	}
	if ex, _ := s.Expired(time.Now().Add(time.Second)); len(ex) != 0 {
		t.Fatalf("a held run expired: %v", ex)
	}
	if err := s.Release("r"); err == nil {
		t.Fatal("released a held run")
	}
	later := time.Now().Add(time.Hour)
	for _, bad := range [][2]record.Address{{record.Sum([]byte("other")), head}, {target, record.Sum([]byte("other head"))}} {
		if ok, err := s.DropHold("r", bad[0], bad[1]); err != nil || ok {
			t.Fatalf("dropped by another target or head: %v %v", ok, err)
		}
		if ok, err := s.RenewHold("r", bad[0], bad[1], later); err != nil || ok {
			t.Fatalf("renewed by another target or head: %v %v", ok, err)
		}
	}
	if ok, err := s.RenewHold("r", target, head, later); err != nil || !ok {
		t.Fatalf("renew: %v %v", ok, err)
	}
	if ok, err := s.RenewHold("r", target, head, later.Add(-time.Minute)); err != nil || ok {
		t.Fatalf("renewed to an earlier time: %v %v", ok, err)
	}
	s = mustReopen(t, s)
	if h, ok, err := s.HoldOf("r"); err != nil || !ok || !h.Since.Equal(later) {
		t.Fatalf("renewed hold %+v %v %v; want since %v", h, ok, err, later)
	}
	if ok, err := s.DropHold("r", target, head); err != nil || !ok {
		t.Fatalf("drop: %v %v", ok, err)
	}
	if hs, _ := s.Holds(); len(hs) != 0 {
		t.Fatalf("holds left: %v", hs)
	}
	if ex, _ := s.Expired(time.Now().Add(time.Second)); !slices.Equal(ex, []string{"r"}) {
		t.Fatalf("expired %v once the hold ended", ex)
	}
}

// A run back here ends its hold, in the transaction that makes it this
// host's again: reclaimed (a hand-over taken back), taken over (an orphan
// adopted), or arrived (a bundle or migration extending it, or the
// operator's reclaim of its record). The run's target holds it no more.
// Seen failing first: each left the hold.
func TestHoldEndsWhenRunIsBack(t *testing.T) {
	target := record.Sum([]byte("target"))
	for name, back := range map[string]func(s *Store, head record.Address) error{
		"reclaimed":  func(s *Store, head record.Address) error { return s.Reclaim("r", head) },
		"taken over": func(s *Store, head record.Address) error { return s.TakeOver("r", head) },
		"arrived": func(s *Store, _ record.Address) error {
			rec, err := s.Record("r")
			if err == nil {
				_, err = s.Extend("r", rec, false, true)
			}
			return err
		},
	} {
		s := mustStore(t)
		head, _ := parkedRun(t, s, "r", map[string]string{"pages.img": "pages"})
		if err := s.HandOff("r", head); err != nil {
			t.Fatal(err)
		}
		if err := s.AddHold("r", target, head); err != nil {
			t.Fatal(err)
		}
		if err := back(s, head); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if h, ok, err := s.HoldOf("r"); err != nil || ok {
			t.Fatalf("%s: the hold stays: %+v %v", name, h, err)
		}
	}
}

// OwedBytes are the bytes of the slabs owed that are not stored yet, each
// counted once: what the store's filesystem must still take for them.
func TestOwedBytes(t *testing.T) {
	src, dst := mustStore(t), mustStore(t)
	_, dir := parkedRun(t, src, "r", map[string]string{"core.img": "core", "pages.img.slabs/00": "slab zero", "pages.img.slabs/01": "slab one"})
	es, err := src.Listing(dir)
	if err != nil {
		t.Fatal(err)
	}
	var slabs []record.Address
	for _, e := range es {
		if strings.HasPrefix(e.Name, "pages.img.slabs/0") {
			slabs = append(slabs, e.Address)
		}
	}
	owedRun(t, src, dst, dir, slabs...)
	if n, err := dst.OwedBytes(); err != nil || n != uint64(len("slab zero")+len("slab one")) {
		t.Fatalf("owed bytes %d: %v", n, err)
	}
	if _, err := dst.PutBytes([]byte("slab one")); err != nil { // adopted, not settled
		t.Fatal(err)
	}
	if n, err := dst.OwedBytes(); err != nil || n != uint64(len("slab zero")) {
		t.Fatalf("owed bytes %d once one slab is stored: %v", n, err)
	}
}

// A stranded owing (Store.Strand) keeps its owing as it was, survives a
// restart, makes Owes say ErrStranded with its reason (with ErrOwed), keeps
// its first reason, and leaves its slabs out of OwedBytes; Abandon ends
// it with the owing. A mark whose head is not the owing's (an older
// daemon's leftover) is not the owing's. A run owing nothing is not
// stranded.
func TestStrandedOwing(t *testing.T) {
	src, dst := mustStore(t), mustStore(t)
	_, dir := parkedRun(t, src, "r", map[string]string{"core.img": "core", "pages.img.slabs/00": "slab zero"})
	es, err := src.Listing(dir)
	if err != nil {
		t.Fatal(err)
	}
	var slab record.Address
	for _, e := range es {
		if e.Name == "pages.img.slabs/00" {
			slab = e.Address
		}
	}
	owedRun(t, src, dst, dir, slab)
	before, err := dst.OwedBytes()
	if err != nil || before == 0 {
		t.Fatalf("owed bytes %d, %v", before, err)
	}
	if err := dst.Strand("none", "no owing"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := dst.StrandOf("none"); ok || err != nil {
		t.Fatalf("a run owing nothing stranded: %v", err)
	}
	if err := dst.Strand("r", "the source holds the run no more"); err != nil {
		t.Fatal(err)
	}
	if err := dst.Strand("r", "a second reason"); err != nil {
		t.Fatal(err)
	}
	dst = mustReopen(t, dst)
	sd, ok, err := dst.StrandOf("r")
	if err != nil || !ok || sd.Reason != "the source holds the run no more" || sd.Since.IsZero() {
		t.Fatalf("strand %+v, %v, %v", sd, ok, err)
	}
	err = dst.Owes("r")
	if !errors.Is(err, ErrOwed) || !errors.Is(err, ErrStranded) || !strings.Contains(err.Error(), sd.Reason) {
		t.Fatalf("owes of a stranded run: %v", err)
	}
	if o, ok, err := dst.Owed("r"); err != nil || !ok || !slices.Equal(o.Slabs, []record.Address{slab}) {
		t.Fatalf("the stranded owing changed: %+v, %v, %v", o, ok, err)
	}
	if n, err := dst.OwedBytes(); err != nil || n != 0 {
		t.Fatalf("owed bytes of a stranded owing %d, %v; want 0", n, err)
	}
	// A mark left for another owing of the run is not this owing's.
	if err := dst.commit(func(tx *bolt.Tx) error {
		return tx.Bucket(bktStrand).Put([]byte("r"), Strand{Reason: "old"}.encode(record.Sum([]byte("another head"))))
	}); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := dst.StrandOf("r"); ok || err != nil || errors.Is(dst.Owes("r"), ErrStranded) {
		t.Fatalf("another owing's mark taken as this one's: %v, %v", ok, err)
	}
	if err := dst.Strand("r", "again"); err != nil {
		t.Fatal(err)
	}
	if err := dst.Abandon("r"); err != nil {
		t.Fatal(err)
	}
	if _, ok, err := dst.StrandOf("r"); ok || err != nil {
		t.Fatalf("stranded after its owing ended: %v", err)
	}
	if err := dst.view(func(tx *bolt.Tx) error {
		if tx.Bucket(bktStrand).Get([]byte("r")) != nil {
			return errors.New("the mark outlived its owing")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

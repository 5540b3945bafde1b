package member

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/bundletest"
	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// A migration whose park is refused moves nothing: the error is the
// park's, the target is never asked to take the run, the directory still
// names this host its owner with no transfer, the store has not handed it
// off, and no migration is counted. The run is here as it was, and a
// migration tried again (the park now succeeding) moves it.
func TestMigrateParkRefused(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/park-refused/", 5*time.Second)
	a, b := join(t, dir, "a"), join(t, dir, "b")
	p := &peers{}
	m, st, n, rec := room(t, a, p)
	before, _ := st.Run("r")
	refused := errors.New("checkpoint refused")
	run := &parked{executing: true, park: refused}
	hold := func() (Held, func(), error) { return run, func() {}, nil }
	err := m.migrate(t.Context(), "r", b.Key(), hold, nil)
	if !errors.Is(err, refused) || run.parks.Load() != 1 || p.handed.Load() != 0 {
		t.Fatalf("migrate with a refused park: %v (%d parks, %d hands)", err, run.parks.Load(), p.handed.Load())
	}
	if e, err := dir.Run(t.Context(), rec.Genesis()); err != nil || e.Owner != a.Key() || !e.To.IsZero() || e.Head != rec.Head() {
		t.Fatalf("after the refused park the directory says %+v, %v", e, err)
	}
	if after, _ := st.Run("r"); after.Head != before.Head || after.Len != before.Len {
		t.Fatal("a refused park changed the record")
	}
	if _, off, _ := st.HandedOff("r"); off || n.out.Load() != 0 || n.failed.Load() != 0 {
		t.Fatalf("after the refused park: handed off %v, %d out, %d failed counted", off, n.out.Load(), n.failed.Load())
	}
	if err := bundle.Exportable(st, "r"); err != nil {
		t.Fatalf("the run is no longer this host's to move: %v", err)
	}
	run.park = nil
	if err := m.migrate(t.Context(), "r", b.Key(), hold, nil); err != nil {
		t.Fatalf("migrate again: %v", err)
	}
	if e, _ := dir.Run(t.Context(), rec.Genesis()); e.To != b.Key() || run.parks.Load() != 2 || n.out.Load() != 1 {
		t.Fatalf("after the second migration the directory says %+v (%d parks)", e, run.parks.Load())
	}
}

// receiver is a member under session h over an empty store, trusting
// every signer, that receives runs from p.
func receiver(t *testing.T, h *fleet.Session, p Peers) (*Member, *store.Store, *counts) {
	t.Helper()
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	n := &counts{}
	trusted := func(record.Address) bool { return true }
	m := New(Config{Join: Join{Fleet: h, Peers: p}, Store: st, Metrics: n, Publish: func(events.Event) {},
		Import: bundle.ImportOptions{Options: bundle.Options{Trusted: trusted}, CheckID: func(string) error { return nil }}})
	return m, st, n
}

// A received run the import refuses (its signer is not trusted here) is
// refused with the import's error and counted as a failed migration in;
// the store is as it was — no run, no object adopted, nothing left
// staged — the run is not claimed, and nothing is resumed.
func TestReceiveImportRefused(t *testing.T) {
	dir, a, b, src, rec := handedOver(t, "/receive-refused/")
	p := &peers{from: src, src: "r"}
	m, st, n := receiver(t, b, p)
	m.cfg.Import.Trusted = func(record.Address) bool { return false }
	run := &parked{}
	released := false
	hold := func() (Held, func(), error) { return run, func() { released = true }, nil }
	err := m.receive(t.Context(), a.Key(), handed(rec, true), hold)
	var untrusted *attest.UntrustedError
	if !errors.As(err, &untrusted) || p.fetched.Load() != 1 {
		t.Fatalf("receive of a run signed by an untrusted key: %v (%d fetches)", err, p.fetched.Load())
	}
	if n.failed.Load() != 1 || n.in.Load() != 0 || n.refused.Load() != 0 {
		t.Fatalf("counted %d failed, %d in, %d ownership refusals", n.failed.Load(), n.in.Load(), n.refused.Load())
	}
	if run.resumes.Load() != 0 || !released {
		t.Fatalf("%d resumes, released %v", run.resumes.Load(), released)
	}
	if ids, err := st.AllRuns(); err != nil || len(ids) != 0 {
		t.Fatalf("runs after the refusal: %v, %v", ids, err)
	}
	unchanged(t, st)
	if e, err := dir.Run(t.Context(), rec.Genesis()); err != nil || e.Owner != a.Key() || e.To != b.Key() {
		t.Fatalf("after the refusal the directory says %+v, %v", e, err)
	}
}

// unchanged checks that st, empty before a refused receive, holds no
// object and has nothing staged.
func unchanged(t *testing.T, st *store.Store) {
	t.Helper()
	var n int
	root := filepath.Join(st.Dir(), "objects")
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			n++
		}
		return nil
	})
	if err != nil || n != 0 {
		t.Fatalf("a refused receive left %d files under objects/ (staging included): %v", n, err)
	}
}

// A receive no transfer in the directory names is refused before anything
// is fetched: the run has no entry, or one its owner did not transfer, or
// transferred to another host; the caller is not its owner, or the owner's
// session that claimed it is gone; the head named is not the entry's; the
// hand-over names no genesis (an older source's). A record that is not
// the transferred run's is refused before its objects are asked for. The
// store is as it was each time.
func TestReceiveUnsolicited(t *testing.T) {
	dir, a, b, src, rec := handedOver(t, "/receive-unsolicited/")
	c := join(t, dir, "c")
	other := record.Sum([]byte("another run"))
	for name, tc := range map[string]struct {
		from    *fleet.Session
		h       Handed
		fetches int32
	}{
		"no entry":       {a, Handed{Run: "r", Genesis: other, Head: other}, 0},
		"not the owner":  {c, handed(rec, false), 0},
		"another head":   {a, Handed{Run: "r", Genesis: rec.Genesis(), Head: other}, 0},
		"no genesis":     {a, Handed{Run: "r"}, 0},
		"another record": {a, Handed{Run: "r", Genesis: rec.Genesis(), Head: rec.Head()}, 1},
	} {
		t.Run(name, func(t *testing.T) {
			p := &peers{from: src, src: "r"}
			if name == "another record" {
				// The source sends another run's record under the id.
				p.from, p.src = forged(t, "r")
			}
			m, st, _ := receiver(t, b, p)
			err := m.receive(t.Context(), tc.from.Key(), tc.h, func() (Held, func(), error) { t.Fatal("held"); return nil, nil, nil })
			if !errors.Is(err, ErrUnsolicited) || p.fetched.Load() != tc.fetches {
				t.Fatalf("receive: %v (%d fetches)", err, p.fetched.Load())
			}
			if errors.Is(err, fleet.ErrNoRun) || errors.Is(err, fleet.ErrNotOwner) {
				t.Fatalf("the refusal wraps the directory's error (the API would answer not_owner): %v", err)
			}
			unchanged(t, st)
		})
	}
	// Not transferred to this host: c receives a's transfer to b; then a
	// takes it back and b receives it.
	for name, at := range map[string]*fleet.Session{"to another host": c, "taken back": b} {
		t.Run(name, func(t *testing.T) {
			if name == "taken back" {
				if _, err := a.Transfer(t.Context(), rec.Genesis(), a.Key()); err != nil {
					t.Fatal(err)
				}
			}
			p := &peers{from: src, src: "r"}
			m, st, _ := receiver(t, at, p)
			err := m.receive(t.Context(), a.Key(), handed(rec, false), func() (Held, func(), error) { t.Fatal("held"); return nil, nil, nil })
			if !errors.Is(err, ErrUnsolicited) || p.fetched.Load() != 0 {
				t.Fatalf("receive: %v (%d fetches)", err, p.fetched.Load())
			}
			unchanged(t, st)
		})
	}
}

// A receive whose owner's session is gone is refused before anything is
// fetched.
func TestReceiveOwnerGone(t *testing.T) {
	_, a, b, src, rec := handedOver(t, "/receive-owner-gone/")
	if err := a.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	p := &peers{from: src, src: "r"}
	m, st, _ := receiver(t, b, p)
	err := m.receive(t.Context(), a.Key(), handed(rec, false), func() (Held, func(), error) { t.Fatal("held"); return nil, nil, nil })
	if !errors.Is(err, ErrUnsolicited) || p.fetched.Load() != 0 {
		t.Fatalf("receive from a host whose session is gone: %v (%d fetches)", err, p.fetched.Load())
	}
	unchanged(t, st)
}

// One host may have MaxReceives receives under way at once: one more is
// refused before the directory is asked.
func TestReceivesBounded(t *testing.T) {
	_, a, b, src, rec := handedOver(t, "/receive-bounded/")
	p := &peers{from: src, src: "r"}
	m, _, _ := receiver(t, b, p)
	for range DefaultMaxReceives {
		done, ok := m.receiving.take(a.Key(), DefaultMaxReceives)
		if !ok {
			t.Fatal("refused within the bound")
		}
		defer done()
	}
	err := m.receive(t.Context(), a.Key(), handed(rec, false), func() (Held, func(), error) { t.Fatal("held"); return nil, nil, nil })
	if !errors.Is(err, ErrReceiving) || p.fetched.Load() != 0 {
		t.Fatalf("a receive past the bound: %v", err)
	}
	if done, ok := m.receiving.take(b.Key(), DefaultMaxReceives); !ok {
		t.Fatal("another host's receive refused")
	} else {
		done()
	}
}

// A received run whose resume fails is handed back to its source, which
// is waiting for the answer: stored here but handed off at the head it
// came with, transferred back to the source in the directory (whose
// take-back claims it), counted as received; the error is the resume's.
// Once the source has stopped waiting (the request's context done), the
// run stays here, this host's, parked.
func TestReceiveResumeRefused(t *testing.T) {
	for _, gone := range []bool{false, true} {
		t.Run(map[bool]string{false: "waiting", true: "gone"}[gone], func(t *testing.T) {
			dir, a, b, src, rec := handedOver(t, "/resume-refused/"+map[bool]string{false: "waiting", true: "gone"}[gone]+"/")
			p := &peers{from: src, src: "r"}
			m, st, n := receiver(t, b, p)
			left := handedOff(m)
			refused := errors.New("restore refused")
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			run := &parked{resume: refused}
			if gone {
				run.onResume = cancel
			}
			err := m.receive(ctx, a.Key(), handed(rec, true), func() (Held, func(), error) { return run, func() {}, nil })
			if !errors.Is(err, refused) || run.resumes.Load() != 1 {
				t.Fatalf("receive with a refused resume: %v (%d resumes)", err, run.resumes.Load())
			}
			if n.in.Load() != 1 || n.failed.Load() != 0 {
				t.Fatalf("counted %d in, %d failed", n.in.Load(), n.failed.Load())
			}
			got, err := st.Run("r")
			if err != nil || got.Head != rec.Head() || got.Phase != record.PhaseParked {
				t.Fatalf("the received run: %+v, %v", got, err)
			}
			if _, err := st.Check(t.Context()); err != nil {
				t.Fatal(err)
			}
			e, err := dir.Run(t.Context(), rec.Genesis())
			if err != nil || e.Owner != b.Key() || e.Head != rec.Head() || e.Phase != record.PhaseParked {
				t.Fatalf("after the receive the directory says %+v, %v", e, err)
			}
			h, off, _ := st.HandedOff("r")
			if gone {
				if off || !e.To.IsZero() || len(*left) != 0 {
					t.Fatalf("the source gone, the run is handed off (%v, told %q) or transferred (%s)", off, *left, e.To)
				}
				return
			}
			if !off || h.Head != rec.Head() || e.To != a.Key() || !slices.Equal(*left, []string{"r"}) {
				t.Fatalf("not handed back: handed off %v at %s (told %q), transferred to %s", off, h.Head, *left, e.To)
			}
		})
	}
}

// A migration whose target claimed the run, failed its resume and handed
// it back (Receive) ends with the run here, as before it moved: claimed
// back in the directory, not handed off in the store; the error is the
// target's.
func TestMigrateTakesBackAHandedBackRun(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/handed-back/", 5*time.Second)
	a, b := join(t, dir, "a"), join(t, dir, "b")
	refused := errors.New("image refused")
	p := &peers{hand: refused}
	m, st, n, rec := room(t, a, p)
	left := handedOff(m)
	p.onHand = func() {
		if _, err := b.Claim(t.Context(), rec.Genesis(), "r", rec.Head(), record.PhaseParked); err != nil {
			t.Error(err)
		}
		if _, err := b.Transfer(t.Context(), rec.Genesis(), a.Key()); err != nil {
			t.Error(err)
		}
	}
	run := &parked{executing: true}
	err := m.migrate(t.Context(), "r", b.Key(), func() (Held, func(), error) { return run, func() {}, nil }, nil)
	if !errors.Is(err, refused) || errors.Is(err, fleet.ErrNotOwner) || n.failed.Load() != 1 {
		t.Fatalf("migrate to a target that handed the run back: %v (%d failed)", err, n.failed.Load())
	}
	if run.parks.Load() != 1 || run.resumes.Load() != 1 {
		t.Fatalf("the unit the migration parked: %d parks, %d resumes here; want it running here again", run.parks.Load(), run.resumes.Load())
	}
	if _, off, _ := st.HandedOff("r"); off || len(*left) != 0 {
		t.Fatalf("the run handed back is still handed off here, or told so (%q)", *left)
	}
	if e, err := dir.Run(t.Context(), rec.Genesis()); err != nil || e.Owner != a.Key() || !e.To.IsZero() {
		t.Fatalf("the directory says %+v, %v", e, err)
	}
}

// A received run this host could not resume now (Config.Fits refuses it)
// is stored but not claimed: left here handed off at the head it came
// with, the directory still naming the source its owner with the transfer
// pending (the source takes it back), nothing resumed, counted failed.
func TestReceiveRefusedWhenItDoesNotFit(t *testing.T) {
	dir, a, b, src, rec := handedOver(t, "/receive-unfit/")
	m, st, n := receiver(t, b, &peers{from: src, src: "r"})
	unfit := errors.New("this host has no CRIU")
	m.cfg.Fits = func(context.Context, string) error { return unfit }
	run := &parked{}
	err := m.receive(t.Context(), a.Key(), handed(rec, true), func() (Held, func(), error) { return run, func() {}, nil })
	if !errors.Is(err, unfit) || run.resumes.Load() != 0 || n.failed.Load() != 1 || n.in.Load() != 0 {
		t.Fatalf("receive of a run that does not fit: %v (%d resumes, %d failed, %d in)", err, run.resumes.Load(), n.failed.Load(), n.in.Load())
	}
	if h, off, err := st.HandedOff("r"); err != nil || !off || h.Head != rec.Head() {
		t.Fatalf("the refused run is not left handed off: %+v %v %v", h, off, err)
	}
	if e, err := dir.Run(t.Context(), rec.Genesis()); err != nil || e.Owner != a.Key() || e.To != b.Key() {
		t.Fatalf("after the refusal the directory says %+v, %v", e, err)
	}
	if _, err := st.Check(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// A migration whose hand-over is refused here (the store says the run is
// not exportable; the fleet refuses the transfer, to a host it never
// admitted) leaves the run here, not handed off, this host's in the
// directory with no transfer, the target never asked, counted failed. A
// drain's, or a migrate on a host being drained, leaves it parked as the
// migration left it; any other migrate resumes it here.
func TestMigrateHandOverRefused(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/handover-refused/", 5*time.Second)
	a, b := join(t, dir, "a"), join(t, dir, "b")
	notExportable := errors.New("not exportable")
	for name, tc := range map[string]struct {
		to         record.Address
		exportable func(string) error
		want       error
		placed     *placement // a drain's
		draining   bool
		resumes    int32
	}{
		"exportable": {to: b.Key(), exportable: func(string) error { return notExportable }, want: notExportable, placed: &placement{}},
		"transfer":   {to: record.Sum([]byte("never admitted")), want: fleet.ErrNotAdmitted, placed: &placement{}},
		"migrate":    {to: b.Key(), exportable: func(string) error { return notExportable }, want: notExportable, resumes: 1},
		"migrate, draining": {to: b.Key(), exportable: func(string) error { return notExportable }, want: notExportable,
			draining: true},
	} {
		t.Run(name, func(t *testing.T) {
			p := &peers{}
			m, st, n, rec := room(t, a, p)
			if tc.exportable != nil {
				m.cfg.Exportable = tc.exportable
			}
			m.draining.Store(tc.draining)
			run := &parked{executing: true}
			err := m.migrate(t.Context(), "r", tc.to, func() (Held, func(), error) { return run, func() {}, nil }, tc.placed)
			if !errors.Is(err, tc.want) || run.parks.Load() != 1 || p.handed.Load() != 0 || n.failed.Load() != 1 {
				t.Fatalf("migrate: %v (%d parks, %d hands, %d failed)", err, run.parks.Load(), p.handed.Load(), n.failed.Load())
			}
			if run.resumes.Load() != tc.resumes {
				t.Fatalf("the failed migration resumed the run here %d times, want %d", run.resumes.Load(), tc.resumes)
			}
			if _, off, _ := st.HandedOff("r"); off {
				t.Fatal("handed off")
			}
			if e, err := dir.Run(t.Context(), rec.Genesis()); err != nil || e.Owner != a.Key() || !e.To.IsZero() {
				t.Fatalf("the directory says %+v, %v", e, err)
			}
		})
	}
}

// A target that claims the run and then fails the hand (its answer lost)
// has it: the take-back is refused in the fleet, so the run stays handed
// off here, and the error says both.
func TestMigrateTakeBackRefused(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/takeback-refused/", 5*time.Second)
	a, b := join(t, dir, "a"), join(t, dir, "b")
	lost := errors.New("the answer was lost")
	p := &peers{hand: lost}
	m, st, n, rec := room(t, a, p)
	left := handedOff(m)
	p.onHand = func() {
		if _, err := b.Claim(t.Context(), rec.Genesis(), "r", rec.Head(), record.PhaseParked); err != nil {
			t.Error(err)
		}
	}
	err := m.migrate(t.Context(), "r", b.Key(), func() (Held, func(), error) { return &parked{}, func() {}, nil }, nil)
	if !errors.Is(err, lost) || !errors.Is(err, fleet.ErrNotOwner) || n.failed.Load() != 1 {
		t.Fatalf("migrate to a target that claimed and failed: %v (%d failed)", err, n.failed.Load())
	}
	if _, off, _ := st.HandedOff("r"); !off || !slices.Equal(*left, []string{"r"}) {
		t.Fatalf("the run the target claimed is not handed off here, or not told so (%q)", *left)
	}
	if e, err := dir.Run(t.Context(), rec.Genesis()); err != nil || e.Owner != b.Key() || !e.To.IsZero() {
		t.Fatalf("the directory says %+v, %v", e, err)
	}
}

// handed is the hand-over of run r at rec's head, as a's migrate asks it.
func handed(rec *record.Record, resume bool) Handed {
	return Handed{Run: "r", Genesis: rec.Genesis(), Head: rec.Head(), Resume: resume}
}

// handedOver is a fleet under prefix with hosts a and b, and a's run r in
// src handed over to b as a's migrate does: transferred in the directory,
// handed off in a's store.
func handedOver(t *testing.T, prefix string) (*fleet.Dir, *fleet.Session, *fleet.Session, *store.Store, *record.Record) {
	t.Helper()
	dir := fleet.New(etcdtest.Shared(t).Client(t), prefix, 5*time.Second)
	a, b := join(t, dir, "a"), join(t, dir, "b")
	_, src, _, rec := room(t, a, &peers{})
	if _, err := a.Transfer(t.Context(), rec.Genesis(), b.Key()); err != nil {
		t.Fatal(err)
	}
	if err := src.HandOff("r", rec.Head()); err != nil {
		t.Fatal(err)
	}
	return dir, a, b, src, rec
}

// forged is a store holding another run than room's, parked, under id.
func forged(t *testing.T, id string) (*store.Store, string) {
	t.Helper()
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	b, err := bundletest.Run{Spec: unit.Spec{Image: "example/unit:1", ImageDigest: "sha256:" + strings.Repeat("a", 64), Mode: unit.TranscriptMode, Args: []string{"another"}},
		Grants: unit.Grants{Network: unit.NoNetwork}, Key: key, Transcript: []byte("{\"t\":1}\n")}.Forge(id)
	if err != nil {
		t.Fatal(err)
	}
	trusted := func(record.Address) bool { return true }
	if _, err := bundle.Import(t.Context(), st, bytes.NewReader(b.Tar(nil)), bundle.ImportOptions{Options: bundle.Options{Trusted: trusted}}); err != nil {
		t.Fatal(err)
	}
	return st, id
}

// A migration waits, before it parks the run, while this host has
// DefaultMaxReceives migrations under way to the same target (a drain at
// its default, say): the target would refuse one more receive as busy
// (ErrReceiving) after the run was parked for it. Given up, nothing
// moved and the unit was not parked; a slot freed, it moves.
func TestMigrateWaitsForTheTargetsRoom(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/send-slots/", 5*time.Second)
	a, b := join(t, dir, "a"), join(t, dir, "b")
	p := &peers{}
	m, _, _, rec := room(t, a, p)
	run := &parked{executing: true}
	held := atomic.Int32{}
	hold := func() (Held, func(), error) { held.Add(1); return run, func() { held.Add(-1) }, nil }
	var releases []func()
	for range DefaultMaxReceives {
		release, err := m.sending.wait(t.Context(), b.Key())
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, release)
	}
	short, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if err := m.migrate(short, "r", b.Key(), hold, nil); !errors.Is(err, ErrSending) || !errors.Is(err, context.DeadlineExceeded) || run.parks.Load() != 0 || p.handed.Load() != 0 {
		t.Fatalf("migrate to a target with %d migrations under way: %v (%d parks, %d hands)", DefaultMaxReceives, err, run.parks.Load(), p.handed.Load())
	}
	if e, err := dir.Run(t.Context(), rec.Genesis()); err != nil || e.Owner != a.Key() || !e.To.IsZero() {
		t.Fatalf("after the wait was given up the directory says %+v, %v", e, err)
	}
	done := make(chan error, 1)
	go func() { done <- m.migrate(t.Context(), "r", b.Key(), hold, nil) }()
	select {
	case err := <-done:
		t.Fatalf("migrate went on with every slot taken: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	// Waiting, it does not hold the run: its park, close or stop, and
	// the lease's freeze, go on.
	if n := held.Load(); n != 0 {
		t.Fatalf("a migration waiting for a slot holds the run (%d)", n)
	}
	releases[0]()
	if err := <-done; err != nil || run.parks.Load() != 1 || p.handed.Load() != 1 {
		t.Fatalf("migrate once a slot was freed: %v (%d parks, %d hands)", err, run.parks.Load(), p.handed.Load())
	}
	for _, r := range releases[1:] {
		r()
	}
}

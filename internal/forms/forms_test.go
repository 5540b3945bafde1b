package forms

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/imageparks"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/platform"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

func imageRun(id string) Run {
	return Run{ID: id, Spec: unit.Spec{Image: "example/unit:1", Args: []string{"/unit"}, Mode: unit.ImageMode}}
}

func transcriptRun(id string) Run {
	r := imageRun(id)
	r.Spec.Mode = unit.TranscriptMode
	return r
}

func status(t *testing.T, sb Sandbox) string {
	t.Helper()
	s, err := sb.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// An image unit's walk: started under the run's id, its snapshot taken
// frozen with the image keys and CRIU's statistics journaled, thawed by
// settling, and woken by a restore of exactly the images it stored.
func TestImageSnapshotThawWake(t *testing.T) {
	h, box := testHost(t, nil)
	f := h.For(unit.ImageMode)
	w, err := f.Start(t.Context(), stored(t, h, imageRun("r")))
	if err != nil {
		t.Fatal(err)
	}
	if w.Unit.Sandbox.ID() != "r" || w.Event != "started" || w.Unit.Channel() != nil {
		t.Fatalf("started %s (%s), channel %v", w.Unit.Sandbox.ID(), w.Event, w.Unit.Channel())
	}
	if a := w.Unit.Account(); a == nil || len(a.Dispatched)+len(a.Resolved) != 0 {
		t.Fatalf("an image unit's account %+v, want an empty one", a)
	}
	taken, err := f.Snapshot(t.Context(), w.Unit)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(taken.Keys, manifest.ImageKeys) || taken.Checkpoint == nil || len(taken.Details) != 1 || taken.Retained <= 0 {
		t.Fatalf("taken %+v", taken)
	}
	if got := status(t, w.Unit.Sandbox); got != "paused" {
		t.Fatalf("after the snapshot the unit is %s, want frozen", got)
	}
	if err := f.Thaw(t.Context(), w.Unit); err != nil || status(t, w.Unit.Sandbox) != "running" {
		t.Fatalf("thaw: %v, %s", err, status(t, w.Unit.Sandbox))
	}
	teardown := make(chan struct{})
	close(teardown)
	woke, err := f.Wake(t.Context(), imageRun("r"), Waking{Snapshot: taken.Snapshot, Retained: taken.Retained, Teardown: teardown})
	if err != nil {
		t.Fatal(err)
	}
	if len(box.restored) != 1 || box.restored[0] != "core of r, checkpoint 1" {
		t.Fatalf("restored %q", box.restored)
	}
	if woke.Event != attest.EventRestored || woke.Restored == nil || len(woke.Details) != 1 {
		t.Fatalf("woken %+v", woke)
	}
	if _, err := os.Stat(filepath.Join(h.StateDir, "restore", "r")); !os.IsNotExist(err) {
		t.Fatalf("the restore's trees are left: %v", err)
	}
}

// An image wake waits for the parked sandbox's teardown (the restore takes
// its id): given up, nothing is restored.
func TestImageWakeWaitsForTeardown(t *testing.T) {
	h, box := testHost(t, nil)
	if err := h.Gate.Ready(t.Context()); err != nil {
		t.Fatal(err)
	}
	// Done the second time it is asked: the gate's wait goes through, the
	// teardown's is given up.
	ctx := &doneSecond{Context: t.Context()}
	_, err := h.For(unit.ImageMode).Wake(ctx, imageRun("r"), Waking{Teardown: make(chan struct{})})
	if !errors.Is(err, context.Canceled) || len(box.restored) != 0 {
		t.Fatalf("wake before the teardown: %v, %d restores", err, len(box.restored))
	}
}

// An image park's dump and an image resume's restore each wait for a
// slot of the gate (imageparks.Gate.Admit): with every slot taken, both
// wait, and give up with their request, the unit left running and
// nothing restored.
func TestImageWaitsForSlot(t *testing.T) {
	h, box := testHost(t, nil)
	f := h.For(unit.ImageMode)
	w, err := f.Start(t.Context(), stored(t, h, imageRun("r")))
	if err != nil {
		t.Fatal(err)
	}
	var releases []func()
	for range imageparks.Slots() {
		release, err := h.Gate.Admit(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		releases = append(releases, release)
	}
	short, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := f.Snapshot(short, w.Unit); !errors.Is(err, context.DeadlineExceeded) || status(t, w.Unit.Sandbox) != "running" {
		t.Fatalf("a park with every slot taken: %v, unit %s", err, status(t, w.Unit.Sandbox))
	}
	releases[0]()
	taken, err := f.Snapshot(t.Context(), w.Unit)
	if err != nil {
		t.Fatal(err)
	}
	release, err := h.Gate.Admit(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	teardown := make(chan struct{})
	close(teardown)
	waking := Waking{Snapshot: taken.Snapshot, Retained: taken.Retained, Teardown: teardown}
	short, cancel = context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := f.Wake(short, imageRun("r"), waking); !errors.Is(err, context.DeadlineExceeded) || len(box.restored) != 0 {
		t.Fatalf("a resume with every slot taken: %v, %d restores", err, len(box.restored))
	}
	release()
	if _, err := f.Wake(t.Context(), imageRun("r"), waking); err != nil || len(box.restored) != 1 {
		t.Fatalf("a resume with a slot: %v, %d restores", err, len(box.restored))
	}
	for _, r := range releases[1:] {
		r()
	}
}

type doneSecond struct {
	context.Context
	asked int
}

func (c *doneSecond) Done() <-chan struct{} {
	c.asked++
	if c.asked < 2 {
		return nil
	}
	done := make(chan struct{})
	close(done)
	return done
}

func (c *doneSecond) Err() error {
	if c.asked < 2 {
		return nil
	}
	return context.Canceled
}

// Where image parks do not work an image unit is refused at its start, its
// park and its resume; a transcript unit is not.
func TestImageFormClosedGate(t *testing.T) {
	h, _ := testHost(t, errors.New("criu: not found"))
	if _, err := h.Prepare(t.Context(), "r", imageRun("r").Spec, unit.Grants{}); !errors.Is(err, imageparks.ErrUnavailable) {
		t.Fatalf("prepare an image unit: %v", err)
	}
	if _, err := h.Prepare(t.Context(), "r", transcriptRun("r").Spec, unit.Grants{}); err != nil {
		t.Fatalf("prepare a transcript unit: %v", err)
	}
	u := Orphan(imageRun("r"), &fakeUnit{status: "running"})
	if _, err := h.For(unit.ImageMode).Snapshot(t.Context(), u); !errors.Is(err, imageparks.ErrUnavailable) || !strings.HasPrefix(err.Error(), "park r:") {
		t.Fatalf("snapshot: %v", err)
	}
	if _, err := h.For(unit.ImageMode).Wake(t.Context(), imageRun("r"), Waking{}); !errors.Is(err, imageparks.ErrUnavailable) {
		t.Fatalf("wake: %v", err)
	}
}

// A unit's image is pinned to the digest imported here; another digest is
// refused.
func TestPreparePinsImage(t *testing.T) {
	h, _ := testHost(t, nil)
	p, err := h.Prepare(t.Context(), "r", imageRun("r").Spec, unit.Grants{})
	if err != nil || p.Spec.ImageDigest != "sha256:"+strings.Repeat("a", 64) {
		t.Fatalf("prepared %+v, %v", p.Spec, err)
	}
	spec := imageRun("r").Spec
	spec.ImageDigest = "sha256:" + strings.Repeat("b", 64)
	if _, err := h.Prepare(t.Context(), "r", spec, unit.Grants{}); !errors.Is(err, executor.ErrImageMismatch) {
		t.Fatalf("another digest: %v", err)
	}
}

// A restarted daemon's image unit found frozen is settled, and never
// recovered from disk; one found stopped is left to its watcher.
func TestImageReattached(t *testing.T) {
	h, _ := testHost(t, nil)
	for _, st := range []string{"paused", "running", "stopped"} {
		sb := &fakeUnit{status: st}
		rec, err := h.For(unit.ImageMode).Reattached(t.Context(), Orphan(imageRun("r"), sb), st)
		if err != nil || rec {
			t.Fatalf("%s: recover %v, %v", st, rec, err)
		}
		if want := st != "stopped"; (sb.settles > 0) != want {
			t.Fatalf("%s: settled %d times", st, sb.settles)
		}
	}
}

// A restarted daemon's image unit whose lazy restore no daemon saw
// finish is left as it was found: frozen where the last daemon froze it
// for its lost pages (a thaw would run it with no lazy-pages; a thread
// faulting on a missing page then may not freeze again). The daemon
// parks it back.
func TestImageReattachedLazyUnfinished(t *testing.T) {
	h, box := testHost(t, nil)
	h.Sandboxes = restoringBox{box, map[string]bool{}, map[string]bool{"r": true}}
	for _, st := range []string{"paused", "pausing", "running"} {
		sb := &fakeUnit{id: "r", status: st}
		rec, err := h.For(unit.ImageMode).Reattached(t.Context(), Orphan(imageRun("r"), sb), st)
		if err != nil || rec || sb.settles != 0 {
			t.Fatalf("%s: recover %v, %v, settled %d times", st, rec, err, sb.settles)
		}
	}
}

// A transcript unit's walk: each interval its own sandbox (RUN_tN) with
// the channel mounted read-only; its snapshot freezes it and seals the
// transcript under the channel's gate; thawed, it runs; woken, a new
// sandbox over the sealed transcript.
func TestTranscriptSnapshotThawWake(t *testing.T) {
	h, box := testHost(t, nil)
	f := h.For(unit.TranscriptMode)
	w, err := f.Start(t.Context(), stored(t, h, transcriptRun("r")))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Unit.Close()
	spec := box.started["r_t1"]
	if w.Unit.Sandbox.ID() != "r_t1" || w.Event != "started" || len(spec.Mounts) == 0 {
		t.Fatalf("started %s (%s), mounts %+v", w.Unit.Sandbox.ID(), w.Event, spec.Mounts)
	}
	if m := spec.Mounts[len(spec.Mounts)-1]; m.Target != protocol.Dir || m.Source != calls.ChannelDir(h.StateDir, "r") || !m.Own {
		t.Fatalf("channel mount %+v", m)
	}
	release := w.Unit.Hold()
	taken, err := f.Snapshot(t.Context(), w.Unit)
	release()
	if err != nil {
		t.Fatal(err)
	}
	if !taken.Snapshot.IsTranscript() || !slices.Equal(taken.Keys, manifest.TranscriptKeys) || taken.Checkpoint != nil {
		t.Fatalf("taken %+v", taken)
	}
	if status(t, w.Unit.Sandbox) != "paused" {
		t.Fatal("the snapshot did not freeze the unit")
	}
	if err := f.Thaw(t.Context(), w.Unit); err != nil || status(t, w.Unit.Sandbox) != "running" {
		t.Fatalf("thaw: %v", err)
	}
	w.Unit.Close()
	woke, err := f.Wake(t.Context(), transcriptRun("r"), Waking{Snapshot: taken.Snapshot})
	if err != nil {
		t.Fatal(err)
	}
	defer woke.Unit.Close()
	if woke.Event != "resumed" || woke.Unit.Channel() == nil || woke.Restored != nil {
		t.Fatalf("woken %+v", woke)
	}
}

// A transcript snapshot refused (the unit cannot be frozen) records
// nothing and leaves the unit running; a unit whose channel was the last
// daemon's cannot be sealed, and is not accounted.
func TestTranscriptSnapshotRefused(t *testing.T) {
	h, box := testHost(t, nil)
	f := h.For(unit.TranscriptMode)
	w, err := f.Start(t.Context(), transcriptRun("r"))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Unit.Close()
	box.pauseErr = executor.ErrNotFound
	if _, err := f.Snapshot(t.Context(), w.Unit); !errors.Is(err, executor.ErrNotFound) || status(t, w.Unit.Sandbox) != "running" {
		t.Fatalf("snapshot of a unit that cannot freeze: %v, %s", err, status(t, w.Unit.Sandbox))
	}
	orphan := Orphan(transcriptRun("s"), &fakeUnit{box: box, status: "running"})
	if _, err := f.Snapshot(t.Context(), orphan); !errors.Is(err, ErrNoChannel) {
		t.Fatalf("snapshot without a channel: %v", err)
	}
	if orphan.Account() != nil {
		t.Fatal("a unit without its channel is accounted")
	}
}

// A restarted daemon's transcript unit still running is recovered: frozen,
// the transcript it left stored, recorded with the Recovered entry, and its
// channel directory removed by Cleanup. One found stopped is not.
func TestTranscriptRecover(t *testing.T) {
	h, box := testHost(t, nil)
	dir := calls.ChannelDir(h.StateDir, "r")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, protocol.TranscriptFile), []byte("{\"t\":1}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sb := &fakeUnit{box: box, status: "running"}
	u := Orphan(transcriptRun("r"), sb)
	f := h.For(unit.TranscriptMode)
	if rec, err := f.Reattached(t.Context(), u, "stopped"); rec || err != nil {
		t.Fatalf("stopped: recover %v, %v", rec, err)
	}
	if rec, err := f.Reattached(t.Context(), u, "running"); !rec || err != nil {
		t.Fatalf("running: recover %v, %v", rec, err)
	}
	taken, err := f.Recover(t.Context(), u, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sb.status != "paused" || !taken.Snapshot.IsTranscript() || len(taken.Details) != 1 || taken.Details[0].Event() != (attest.Recovered{}).Event() {
		t.Fatalf("recovered %+v, unit %s", taken, sb.status)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the channel directory went before the park was recorded: %v", err)
	}
	if err := taken.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the channel directory after Cleanup: %v", err)
	}
}

// A transcript on disk is recovered only where it extends the one its
// interval began from (sealed): one short of it, torn from it or missing
// (its writes never synced, and the power lost) sends the run back to
// sealed; without sealed a missing one is refused. A sealed transcript
// that cannot be read leaves the one on disk taken.
func TestTranscriptRecoverSealed(t *testing.T) {
	h, _ := testHost(t, nil)
	dir := calls.ChannelDir(h.StateDir, "r")
	path := filepath.Join(dir, protocol.TranscriptFile)
	sealedBytes := []byte("{\"t\":1}\n{\"t\":2}\n")
	a, err := h.Store.PutBytes(sealedBytes)
	if err != nil {
		t.Fatal(err)
	}
	sealed := record.TranscriptSnapshot(a)
	absent := record.TranscriptSnapshot(record.Sum([]byte("never stored")))
	f := h.For(unit.TranscriptMode)
	for _, c := range []struct {
		name   string
		disk   []byte // nil: no file
		sealed *record.Snapshot
		back   bool // parked at sealed
		err    bool
	}{
		{"extends", append(slices.Clip(sealedBytes), "{\"t\":3}\n"...), &sealed, false, false},
		{"equal", sealedBytes, &sealed, true, false},
		{"short", sealedBytes[:5], &sealed, true, false},
		{"torn", []byte("{\"t\":9}\n{\"t\":2}\n{\"t\":3}\n"), &sealed, true, false},
		{"empty", []byte{}, &sealed, true, false},
		{"missing", nil, &sealed, true, false},
		{"missing, no sealed", nil, nil, false, true},
		{"first interval", []byte("{\"t\":1}\n"), nil, false, false},
		{"sealed unreadable", []byte("{\"t\":1}\n"), &absent, false, false},
	} {
		if err := os.RemoveAll(dir); err != nil {
			t.Fatal(err)
		}
		if c.disk != nil {
			if err := os.MkdirAll(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, c.disk, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		u := Orphan(transcriptRun("r"), Gone("r_t1", func(context.Context, string) error { return nil }))
		taken, err := f.Recover(t.Context(), u, c.sealed)
		if c.err {
			if err == nil {
				t.Fatalf("%s: recovered %+v, want refused", c.name, taken)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		want := sealed
		if !c.back {
			want = record.TranscriptSnapshot(record.Sum(c.disk))
		}
		if taken.Snapshot.String() != want.String() {
			t.Fatalf("%s: parked at %v, want %v", c.name, taken.Snapshot, want)
		}
	}
}

// A post wakes only a run parked in its transcript, once nothing it
// awaits is missing; an image run, or one executing, awaits nothing.
func TestAwaited(t *testing.T) {
	h, _ := testHost(t, nil)
	stored(t, h, transcriptRun("r"))
	tr := record.TranscriptSnapshot(record.Sum([]byte("transcript")))
	for _, c := range []struct {
		run  store.Run
		wake bool
	}{
		{store.Run{ID: "r", Phase: record.PhaseParked, Parked: tr}, true},
		{store.Run{ID: "r", Phase: record.PhaseParked, Parked: record.Snapshot{}}, false},
		{store.Run{ID: "r", Phase: record.PhaseExecuting}, false},
	} {
		waiting, wake, err := h.Awaited(c.run)
		if err != nil || wake != c.wake || len(waiting) != 0 {
			t.Errorf("%s %v: waiting %v, wake %v, %v", c.run.Phase, c.run.Parked.IsTranscript(), waiting, wake, err)
		}
	}
}

// A form never wakes a unit from the other form's park: a transcript form
// given an image snapshot would start the unit from nothing, and an image
// form given a transcript would have no images. Both refuse, starting and
// restoring nothing.
func TestWakeRefusesTheOtherForm(t *testing.T) {
	h, box := testHost(t, nil)
	img := h.For(unit.ImageMode)
	w, err := img.Start(t.Context(), stored(t, h, imageRun("r")))
	if err != nil {
		t.Fatal(err)
	}
	taken, err := img.Snapshot(t.Context(), w.Unit)
	if err != nil {
		t.Fatal(err)
	}
	if woke, err := h.For(unit.TranscriptMode).Wake(t.Context(), transcriptRun("r"), Waking{Snapshot: taken.Snapshot}); !errors.Is(err, ErrFormMismatch) {
		t.Fatalf("a transcript form woke from an image snapshot: %+v, %v", woke, err)
	}
	tr := record.TranscriptSnapshot(record.Sum([]byte("a transcript")))
	if woke, err := img.Wake(t.Context(), imageRun("r"), Waking{Snapshot: tr}); !errors.Is(err, ErrFormMismatch) {
		t.Fatalf("an image form woke from a transcript: %+v, %v", woke, err)
	}
	if len(box.restored) != 0 {
		t.Fatalf("restored %q", box.restored)
	}
}

// A run's kin (park.ImageOptions.Kin) is its book's key and its unit's
// image; a run that reads secrets, one whose record arrived in a bundle
// or a migration, and one with a damaged book have none.
func TestKin(t *testing.T) {
	h, _ := testHost(t, nil)
	f := Image{h}
	op := stored(t, h, imageRun("op"))
	if got, want := f.kin(op), (record.Address{}).String()+" example/unit:1"; got != want {
		t.Errorf("the operator's run: kin %q, want %q", got, want)
	}
	books, err := platform.Open(platform.Dir(h.StateDir))
	if err != nil {
		t.Fatal(err)
	}
	key := record.Sum([]byte("platform key"))
	booked := stored(t, h, imageRun("booked"))
	if err := books.Keep("booked", key); err != nil {
		t.Fatal(err)
	}
	if got, want := f.kin(booked), key.String()+" example/unit:1"; got != want {
		t.Errorf("a booked run: kin %q, want %q", got, want)
	}
	secret := stored(t, h, imageRun("secret"))
	secret.Grants.Secrets = []string{"token"}
	if got := f.kin(secret); got != "" {
		t.Errorf("a run reading secrets: kin %q", got)
	}
	elsewhere, _ := testHost(t, nil)
	stored(t, elsewhere, imageRun("arrived"))
	r, err := elsewhere.Store.Record("arrived")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range []string{"arrived unit", "arrived grants"} {
		if _, err := h.Store.PutBytes([]byte(b)); err != nil {
			t.Fatal(err)
		}
	}
	if err := h.Store.Import("arrived", r); err != nil {
		t.Fatal(err)
	}
	if got := f.kin(imageRun("arrived")); got != "" {
		t.Errorf("a run that arrived in a bundle: kin %q", got)
	}
	if err := os.WriteFile(filepath.Join(platform.Dir(h.StateDir), "op"), []byte("damaged\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := f.kin(op); got != "" {
		t.Errorf("a run with a damaged book: kin %q", got)
	}
}

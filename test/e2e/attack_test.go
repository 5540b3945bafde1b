//go:build linux

package e2e

import (
	"bytes"
	"context"
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// The attack suite: a hostile unit (units/hostile) and hostile bundles, one
// test per finding of docs/trust.md. Every test checks that the host is
// untouched, the record unchanged, and the daemon still serving.

// hostileImage is the name the hostile unit's image is imported under.
const hostileImage = "runrecordd.test/hostile:1"

// hostileArchive and hostileDigest: the hostile unit's OCI archive and its
// manifest digest, built by trBuildUnits.
var hostileArchive, hostileDigest string

// Finding 11: two runs of one unit (same image, arguments, environment and
// grants) must not share a genesis, or their records could be exchanged.
// The daemon draws a nonce into each run's unit; a request cannot choose
// one.
func TestAttackTwoRunsTwoGeneses(t *testing.T) {
	privileged(t)
	d := trShared(t)
	ctx := context.Background()
	geneses := map[record.Address]string{}
	for _, id := range []string{"genesis-a", "genesis-b"} {
		trStart(t, d, id, trAgentImage, "STEPS=1")
		s, err := d.c.Show(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if s.Unit == nil || s.Grants == nil || len(s.Unit.Nonce) != unit.NonceLen {
			t.Fatalf("run %s: unit %+v: want a %d-digit nonce", id, s.Unit, unit.NonceLen)
		}
		u, err := s.Unit.ID()
		if err != nil {
			t.Fatal(err)
		}
		g, err := s.Grants.ID()
		if err != nil {
			t.Fatal(err)
		}
		h := record.Genesis(u, g)
		if other, ok := geneses[h]; ok {
			t.Fatalf("runs %s and %s share the genesis %s", other, id, h)
		}
		geneses[h] = id
	}
	// A request that names its own nonce is refused, and starts nothing.
	_, err := d.c.Start(ctx, api.RunRequest{ID: "genesis-chosen",
		Unit:   unit.Spec{Image: trAgentImage, Env: []string{"STEPS=1"}, Mode: unit.TranscriptMode, Nonce: "00112233445566778899aabbccddeeff"},
		Grants: unit.Grants{MilliCPU: 1000, MemoryBytes: 128 << 20, Network: unit.NoNetwork}})
	if err == nil || !strings.Contains(err.Error(), "nonce") {
		t.Fatalf("a run with a chosen nonce: %v, want a refusal naming the nonce", err)
	}
	if _, err := d.run(ctx, "genesis-chosen"); err == nil {
		t.Fatal("the refused run exists")
	}
}

// Finding 10: a run must have one timeline. After an export the source
// host refuses to resume, close, or take results for the run; the same
// bundle imported again (under any id) on a host that holds its genesis is
// refused; a bundle that extends the record, imported back, gives the run
// back to the source, which finishes it; the stale first bundle is then
// refused there too.
func TestAttackForkAfterExport(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	a := trShared(t)
	const id = "fork"
	trStart(t, a, id, trAgentImage, "STEPS=2")
	trParked(t, a, id, 2)
	showA := mustShow(t, a, id)
	var first bytes.Buffer
	if err := a.c.Export(ctx, id, &first); err != nil {
		t.Fatalf("export: %v", err)
	}
	handedOff(t, a, id, showA.Run)
	_, err := a.c.PostResult(ctx, id, "call-1", []byte(trResult(1)))
	apiError(t, err, api.CodeHandedOff)
	// A takes back the very bundle it exported only on the operator's
	// word (reclaim): B may have resumed from it.
	_, err = a.c.Import(ctx, bytes.NewReader(first.Bytes()), "")
	apiError(t, err, api.CodeGenesisHeld)
	b := mustDaemon(t, "fork-second")
	trustHost(t, a, b)
	trustHost(t, b, a)
	mustImportImage(t, b, trAgentArchive, trAgentImage, trAgentDigest)
	imported := time.Now()
	if _, err := b.c.Import(ctx, bytes.NewReader(first.Bytes()), ""); err != nil {
		t.Fatalf("import on B: %v", err)
	}
	// The same bundle again, under another id: a second timeline.
	_, err = b.c.Import(ctx, bytes.NewReader(first.Bytes()), "fork-again")
	apiError(t, err, api.CodeGenesisHeld)
	if _, err := b.run(ctx, "fork-again"); err == nil {
		t.Fatal("the refused import made a run")
	}
	// And under its own id, on B, which did not hand it off.
	_, err = b.c.Import(ctx, bytes.NewReader(first.Bytes()), "")
	apiError(t, err, api.CodeExists)

	// B continues the run, and it parks on its next call. B meters the
	// idle of what it held: since the import, not since the end time in
	// A's attestation (another host's clock, finding 12).
	pr := trPost(t, b, id, "call-1", trResult(1))
	if pr.Resumed == nil || time.Duration(pr.Resumed.ParkedNS) > time.Since(imported) {
		t.Fatalf("B resumed %+v: parked for longer than B has held the run (%v)", pr.Resumed, time.Since(imported))
	}
	trParked(t, b, id, 5)
	showB := mustShow(t, b, id)
	var second bytes.Buffer
	if err := b.c.Export(ctx, id, &second); err != nil {
		t.Fatalf("export from B: %v", err)
	}
	handedOff(t, b, id, showB.Run)

	// Back on A: the bundle extends what A handed off.
	im, err := a.c.Import(ctx, bytes.NewReader(second.Bytes()), "")
	if err != nil {
		t.Fatalf("import back on A: %v", err)
	}
	if im.Run.HandedOff || im.Run.Head != showB.Run.Head || im.Run.Segments != 5 || im.Run.Status != "parked (transcript)" {
		t.Fatalf("imported back on A: %+v, want B's %+v, not handed off", im.Run, showB.Run)
	}
	// The stale first bundle no longer applies anywhere on A.
	_, err = a.c.Import(ctx, bytes.NewReader(first.Bytes()), "")
	apiError(t, err, api.CodeExists)
	trPost(t, a, id, "call-2", trResult(2))
	trClosed(t, a, id)
	if v, err := a.c.Verify(ctx, id); err != nil || !v.OK {
		t.Fatalf("verify on A: %+v, %v", v, err)
	}
}

// Finding 6 (storage): a closed run's image snapshots were kept forever,
// as GC never ran. `runrecordd gc` releases them past the retention time
// (here 0, for the test) unless the run is pinned, then removes what no
// record reaches: the store shrinks by the snapshot, and the run's record
// and evidence still verify.
func TestAttackSnapshotsCollected(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	d := shared(t)
	const id = "gc-image"
	startOracle(t, d, id, oracleImage)
	if _, err := d.c.Park(ctx, id); err != nil {
		t.Fatalf("park: %v", err)
	}
	if _, err := d.c.Resume(ctx, id); err != nil {
		t.Fatalf("resume: %v", err)
	}
	// Pinned, a closed run keeps its images.
	if r, err := d.c.Pin(ctx, id, true); err != nil || !r.Pinned {
		t.Fatalf("pin: %+v, %v", r, err)
	}
	if _, err := d.c.Close(ctx, id, "e2e: gc"); err != nil {
		t.Fatal(err)
	}
	objects := filepath.Join(d.state, "store", "objects")
	before := duBytes(t, objects)
	zero := time.Duration(0)
	g, err := d.c.GC(ctx, &zero, &zero)
	if err != nil {
		t.Fatalf("gc: %v", err)
	}
	if slices.Contains(g.Released, id) {
		t.Fatalf("gc released a pinned run: %+v", g)
	}
	if r, err := d.c.Pin(ctx, id, false); err != nil || r.Pinned {
		t.Fatalf("unpin: %+v, %v", r, err)
	}
	if g, err = d.c.GC(ctx, &zero, &zero); err != nil {
		t.Fatalf("gc: %v", err)
	}
	after := duBytes(t, objects)
	if !slices.Contains(g.Released, id) || g.RemovedBytes < 32<<20 || before-after < 32<<20 {
		t.Fatalf("gc %+v: the store went from %d to %d bytes; want the run's image snapshot (over 32 MiB) gone", g, before, after)
	}
	t.Logf("gc released %v, removed %d objects (%d bytes); store %d -> %d bytes", g.Released, g.Removed, g.RemovedBytes, before, after)
	r, err := d.run(ctx, id)
	if err != nil || !r.Released {
		t.Fatalf("run after gc: %+v, %v", r, err)
	}
	v, err := d.c.Verify(ctx, id)
	if err != nil || !v.OK || v.Segments != r.Segments {
		t.Fatalf("verify after gc: %+v, %v", v, err)
	}
	// Collecting again finds nothing more of it.
	if g, err = d.c.GC(ctx, &zero, &zero); err != nil || len(g.Released) != 0 {
		t.Fatalf("second gc: %+v, %v", g, err)
	}
}

// duBytes is the total size of the regular files under dir.
func duBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(dir, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.Type().IsRegular() {
			info, err := e.Info()
			if err != nil {
				return err
			}
			n += info.Size()
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Finding 6 (storage): a park wrote whatever it had to, full disk or not.
// An image park is now refused, before it writes, with no_space when its
// run's snapshots would pass the run's quota (limits.snapshot_bytes) or
// the store's filesystem would keep less than --min-free; the unit goes on
// and the record is as it was.
func TestAttackParkNoSpace(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	start := func(d *daemon, id string, limits unit.Limits) api.Run {
		t.Helper()
		r, err := d.c.Start(ctx, api.RunRequest{ID: id,
			Unit:   unit.Spec{Image: oracleImage, Env: oracleEnv},
			Grants: unit.Grants{MilliCPU: 1000, MemoryBytes: 256 << 20, Network: unit.NoNetwork, Limits: limits}})
		if err != nil {
			t.Fatalf("start %s: %v", id, err)
		}
		closeAtEnd(t, d, id)
		waitLines(t, d.stdout(id), "the oracle's first verified line", func(ls []line) bool {
			return len(ls) > 0 && last(ls).VerifiedAt > 0
		})
		return r
	}
	refused := func(d *daemon, id, why string) {
		t.Helper()
		was, err := d.run(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		n := len(output(t, d.stdout(id)))
		_, err = d.c.Park(ctx, id)
		if e := apiError(t, err, api.CodeNoSpace); !strings.Contains(e.Message, why) {
			t.Fatalf("no_space %q does not say %q", e.Message, why)
		}
		unchanged(t, d, id, was)
		waitLines(t, d.stdout(id), "the oracle going on after the refused park", func(ls []line) bool { return len(ls) > n+2 })
	}
	// The oracle holds 64 MiB: a 16 MiB quota refuses its first park.
	d := shared(t)
	start(d, "quota", unit.Limits{SnapshotBytes: 16 << 20})
	refused(d, "quota", "snapshot quota")
	// A host that must keep more free than its disk has refuses every park.
	full := mustDaemon(t, "full", func(d *daemon) { d.flags = []string{"--min-free", "1152921504606846976"} })
	mustImportImage(t, full, oracleArchive, oracleImage, oracleDigest)
	start(full, "full", unit.Limits{})
	refused(full, "full", "--min-free")
}

// A copy stays a copy: exported without a handoff, the run stays where it
// is; the host that imports the copy holds it as one (never resumed), and
// exports it again only as a copy, so no chain of exports makes two hosts
// hold the run.
func TestAttackCopyStaysCopy(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	a := trShared(t)
	const id = "copy"
	trStart(t, a, id, trAgentImage, "STEPS=1")
	trParked(t, a, id, 2)
	var copied bytes.Buffer
	if err := a.c.ExportCopy(ctx, id, &copied); err != nil {
		t.Fatalf("export a copy: %v", err)
	}
	if r, err := a.run(ctx, id); err != nil || r.HandedOff {
		t.Fatalf("a copy export handed the run off: %+v, %v", r, err)
	}
	b := mustDaemon(t, "copy-second")
	trustHost(t, a, b)
	mustImportImage(t, b, trAgentArchive, trAgentImage, trAgentDigest)
	im, err := b.c.Import(ctx, bytes.NewReader(copied.Bytes()), "")
	if err != nil {
		t.Fatalf("import the copy: %v", err)
	}
	if !im.Run.HandedOff || im.Run.Status != "copy" {
		t.Fatalf("the copy is held as %+v", im.Run)
	}
	_, err = b.c.PostResult(ctx, id, "call-1", []byte(trResult(1)))
	apiError(t, err, api.CodeHandedOff)
	var again bytes.Buffer
	if err := b.c.Export(ctx, id, &again); err != nil {
		t.Fatalf("export from the copy's host: %v", err)
	}
	c := mustDaemon(t, "copy-third")
	trustHost(t, a, c)
	if im, err = c.c.Import(ctx, bytes.NewReader(again.Bytes()), ""); err != nil {
		t.Fatalf("import on a third host: %v", err)
	}
	if !im.Run.HandedOff || im.Run.Status != "copy" {
		t.Fatalf("a copy of a copy is held as %+v: it and the source could both resume", im.Run)
	}
	// The source still holds the run, and finishes it.
	trPost(t, a, id, "call-1", trResult(1))
	trClosed(t, a, id)
}

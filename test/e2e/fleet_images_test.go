//go:build linux

package e2e

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// TestFleetMigrateForgedImages: an admitted host is a trusted signer of
// the fleet, so a compromised one can rewrite the CRIU images of a run it
// holds, sign the park again and migrate the run (docs/trust.md, "What a
// restore may grant"). Host A does that for each field TestAttackImages
// rewrites (imageForgeries): each forged run is its own
// (forgeImages: a unit of its own), imported on A as A made it and
// migrated, parked, to B. B takes each — its record is sound and A signed
// it — and refuses its resume with image_refused naming the field, before
// anything runs: the run stays parked on B, B its owner in the fleet at
// the head A handed over, its record verifying there; nothing ran. The
// true park, migrated the same way, resumes on B as the same process.
func TestFleetMigrateForgedImages(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	f := fleetCluster(t)
	a, _ := f.host(t, "fleet-forge-a")
	b, keyB := f.host(t, "fleet-forge-b")
	k, err := record.ParseAddress(keyB)
	if err != nil {
		t.Fatal(err)
	}
	const id = "forge-true"
	startOracle(t, a, id, oracleImage)
	_, atPark := park(t, a, id)
	onA := output(t, a.stdout(id))
	var buf bytes.Buffer
	if err := a.c.ExportCopy(ctx, id, &buf); err != nil {
		t.Fatalf("export: %v", err)
	}
	truth := readBundle(t, buf.Bytes())
	key := hostKey(t, a)

	for _, c := range imageForgeries() {
		t.Run(c.name, func(t *testing.T) {
			fid := "forge-" + strings.ToLower(c.name)
			if _, err := importRaw(a, forgeImages(t, truth, key, fid, c.change), fid); err != nil {
				t.Fatalf("import of the forged run on A: %v", err)
			}
			closeAtEnd(t, a, fid)
			closeAtEnd(t, b, fid)
			if _, err := a.c.Migrate(ctx, fid, keyB); err != nil {
				t.Fatalf("migrate: %v\n%s", err, a.logTail())
			}
			was, err := b.run(ctx, fid)
			if err != nil || was.Phase != "parked" || was.Status != "parked (image)" || was.HandedOff {
				t.Fatalf("on B after the migration: %+v, %v", was, err)
			}
			_, err = b.c.Resume(ctx, fid)
			ae := apiError(t, err, api.CodeImageRefused)
			if !strings.Contains(ae.Message, ": "+c.field+": ") {
				t.Fatalf("refused, not naming %s: %v", c.field, ae)
			}
			t.Logf("refused: %s", ae.Message)
			unchanged(t, b, fid, was)
			if out, err := os.ReadFile(b.stdout(fid)); err == nil && len(out) > 0 {
				t.Fatalf("the refused unit wrote %d bytes", len(out))
			}
			e, err := f.dir(t).Run(ctx, genesisOf(t, was))
			if err != nil || e.Owner != k || !e.To.IsZero() || e.Head.String() != was.Head || e.Phase != record.PhaseParked {
				t.Fatalf("directory %+v, %v; want parked at %s, owned by B", e, err, was.Head)
			}
			if v, err := b.c.Verify(ctx, fid); err != nil || !v.OK {
				t.Fatalf("verify on B: %+v, %v", v, err)
			}
		})
	}

	// The true park goes on on B.
	if _, err := a.c.Migrate(ctx, id, keyB); err != nil {
		t.Fatalf("migrate the true park: %v\n%s", err, a.logTail())
	}
	resume(t, b, id, onA, atPark)
}

// TestFleetMigrateRefusedResume: a migration whose target claims the run
// and then refuses its resume (docs/fleet.md, "Migration"). Host A runs
// units as the host's root (--user-namespaces=false
// --allow-host-root-images); B runs them in user namespaces only. A
// running oracle migrated from A to B is parked on A, fetched, judged and
// claimed by B, whose resume refuses the images (image_refused naming
// userns: made without a user namespace) before anything runs. B hands
// the run back: the migration fails with B's refusal, and the run is A's
// again — owned by A in the fleet, not handed off there — and B holds its
// copy handed off, nothing run there. A has resumed it from its true
// snapshot as the same process, and its record verifies.
func TestFleetMigrateRefusedResume(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	f := fleetCluster(t)
	a, keyA := f.start(t, "fleet-root-a", append(f.flags(), "--lease-ttl", "10s",
		"--user-namespaces=false", "--allow-host-root-images"))
	mustImportImage(t, a, oracleArchive, oracleImage, oracleDigest)
	b, keyB := f.host(t, "fleet-userns-b")
	kA, err := record.ParseAddress(keyA)
	if err != nil {
		t.Fatal(err)
	}
	const id = "refused-resume"
	started := startOracle(t, a, id, oracleImage)
	_, err = a.c.Migrate(ctx, id, keyB)
	answered := time.Now()
	ae := apiError(t, err, api.CodeImageRefused)
	if !strings.Contains(ae.Message, "userns") || !strings.Contains(ae.Message, "runs here again") {
		t.Fatalf("migrate to a host refusing the images: %v, want the target's refusal naming userns, and the unit running on A again", ae)
	}
	t.Logf("migrate: %v", ae.Message)

	r, err := a.run(ctx, id)
	if err != nil || r.Phase != "executing" || r.Status != "running" || r.HandedOff {
		t.Fatalf("on A: %+v, %v; want executing there, not handed off", r, err)
	}
	if rb, err := b.run(ctx, id); err != nil || !rb.HandedOff || rb.Phase != "parked" || rb.Segments != r.Segments-1 {
		t.Fatalf("on B: %+v, %v; want handed off parked, one segment before A's %d", rb, err, r.Segments)
	}
	if out, err := os.ReadFile(b.stdout(id)); err == nil && len(out) > 0 {
		t.Fatalf("the refused unit wrote %d bytes on B", len(out))
	}
	e, err := f.dir(t).Run(ctx, genesisOf(t, started))
	if err != nil || e.Owner != kA || !e.To.IsZero() || e.Head.String() != r.Head || e.Phase != record.PhaseExecuting {
		t.Fatalf("directory %+v, %v; want executing at %s, owned by A", e, err, r.Head)
	}
	_, err = b.c.Resume(ctx, id)
	apiError(t, err, "handed_off")

	ls := waitLines(t, a.stdout(id), "a line verified on A after the migration failed", func(ls []line) bool {
		return len(ls) > 0 && last(ls).Time > answered.UnixNano()
	})
	checkOneProcess(t, ls)
	if v, err := a.c.Verify(ctx, id); err != nil || !v.OK {
		t.Fatalf("verify on A: %+v, %v", v, err)
	}
}

//go:build linux

package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestResumeOnSecondHost parks the oracle on one daemon, exports the run's
// bundle and imports it into a fresh daemon (its own state directory, host
// key and embedded containerd). There the resume is refused — the manifest
// names an image digest this host does not have — and leaves the run
// parked; with the image imported it resumes, and the oracle goes on as the
// same process. The second host's record is the first's with its Resumed
// segment appended, and verifies.
func TestResumeOnSecondHost(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	a := shared(t)
	const id = "hop"
	startOracle(t, a, id, oracleImage)
	_, atPark := park(t, a, id)
	onA := output(t, a.stdout(id))
	showA := mustShow(t, a, id)

	bundle := filepath.Join(t.TempDir(), "hop.bundle")
	f, err := os.Create(bundle)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.c.Export(ctx, id, f); err != nil {
		t.Fatalf("export: %v", err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(bundle); err != nil || fi.Size() < 64<<20 {
		t.Fatalf("bundle: %v, %v: want the 64 MiB memory image in it", fi, err)
	}

	b := mustDaemon(t, "second")
	hostA, err := a.c.Host(ctx)
	if err != nil {
		t.Fatal(err)
	}
	hostB, err := b.c.Host(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if hostA.KeyID == hostB.KeyID || hostA.Containerd == hostB.Containerd || !hostB.Embedded {
		t.Fatalf("not a second host: %+v and %+v", hostA, hostB)
	}
	trustHost(t, a, b)
	f, err = os.Open(bundle)
	if err != nil {
		t.Fatal(err)
	}
	im, err := b.c.Import(ctx, f, "")
	f.Close()
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if im.Run.ID != id || im.Run.Phase != "parked" || im.Run.Head != showA.Run.Head || im.Run.Segments != showA.Run.Segments ||
		im.Run.Unit != showA.Run.Unit || im.Run.Grants != showA.Run.Grants || im.Objects == 0 {
		t.Fatalf("imported %+v; exported %+v", im, showA.Run)
	}
	t.Logf("bundle: %d objects, %d bytes", im.Objects, im.Bytes)
	// B's cleanup verifies the run from genesis and closes it.
	was, err := b.run(ctx, id)
	if err != nil {
		t.Fatal(err)
	}

	// The image the manifest names is not on B yet.
	_, err = b.c.Resume(ctx, id)
	ae := apiError(t, err, "manifest_mismatch")
	if !slices.Equal(ae.Keys, []string{"image.digest"}) {
		t.Fatalf("manifest mismatch keys %v, want [image.digest]: %v", ae.Keys, ae)
	}
	t.Logf("refused as it should be: %v", ae)
	unchanged(t, b, id, was)
	if was.Status != "parked (image)" {
		t.Fatalf("after the refusal: %+v", was)
	}

	mustImportImage(t, b, oracleArchive, oracleImage, oracleDigest)
	resume(t, b, id, onA, atPark)

	v, err := b.c.Verify(ctx, id)
	if err != nil || !v.OK {
		t.Fatalf("verify on B: %+v, %v", v, err)
	}
	showB := mustShow(t, b, id)
	n := len(showA.Segments)
	if len(showB.Segments) != n+1 || showB.Segments[n].Kind != "resumed" || showB.Run.Head != showB.Segments[n].Head ||
		showB.Run.Head == showA.Run.Head {
		t.Fatalf("B's segments:%s\nA's:%s", fmtSegments(showB.Segments), fmtSegments(showA.Segments))
	}
	for i, s := range showA.Segments {
		if sb := showB.Segments[i]; sb.Kind != s.Kind || sb.Head != s.Head || sb.Attestation != s.Attestation || sb.Snapshot != s.Snapshot {
			t.Fatalf("segment %d on B %+v, on A %+v", i, sb, s)
		}
	}
	if re := showB.Segments[n]; re.Idle == nil || re.Idle.UJ == 0 || re.Idle.Provenance != "estimated" || re.Snapshot != showA.Segments[n-1].Snapshot {
		t.Fatalf("B's resumed segment %+v", re)
	}
	// A still holds the run parked, as it was.
	handedOff(t, a, id, showA.Run)
}

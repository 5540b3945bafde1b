//go:build linux

package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/pkg/api"
)

// previousVersion is the runrecordd a rolling upgrade starts from in
// TestFleetRollingUpgrade: main before the manifest's per-key rules
// (merge 568c0bb), the last to write format-1 image manifests (the CPU as
// cpu.features, no criu.images) and to read no other.
const previousVersion = "44ddfb20409931c5ea55ec5e726067d354383dae"

// TestFleetRollingUpgrade is a fleet in the middle of a rolling upgrade:
// one host runs the previous runrecordd (previousVersion, built from this
// repository's history), the other the one under test, on the same etcd.
//
//   - An image run migrates from the old host to the new one, with the
//     old host's CLI, and resumes there as the same process: the new host
//     judges the format-1 manifest the old one recorded, and takes the
//     park made without a user namespace under --allow-host-root-images.
//   - Migrated back, it is refused before anything moves, the unit still
//     running: its park here would record format 2, which the old host
//     does not read (manifest_mismatch, drain.ErrFormat, the formats
//     named).
//   - The old host, given a bundle of it parked here anyway, refuses it
//     at import (bad_request, its manifest header), its handed-off copy
//     of the run as it was.
//   - A transcript run, whose park records format 1, migrates from the new
//     host to the old one and finishes there.
func TestFleetRollingUpgrade(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	f := fleetCluster(t)
	prev := buildPrevious(t)
	old, keyOld := f.start(t, "roll-old", append(f.flags(), "--lease-ttl", "10s"), func(d *daemon) { d.bin = prev })
	// The old host runs units as the host's root: the new one resumes its
	// parks only under --allow-host-root-images (docs/operations.md,
	// "Upgrading").
	cur, keyCur := f.start(t, "roll-new", append(f.flags(), "--lease-ttl", "10s", "--allow-host-root-images"))
	mustImportImage(t, cur, oracleArchive, oracleImage, oracleDigest)
	mustImportImage(t, old, oracleArchive, oracleImage, oracleDigest)
	for _, d := range []*daemon{old, cur} {
		mustImportImage(t, d, trAgentArchive, trAgentImage, trAgentDigest)
	}

	// Old to new: an image run, migrated by the old host's CLI.
	const img = "roll-image"
	startOracle(t, old, img, oracleImage)
	if out, err := exec.Command(prev, "migrate", img, "--to", keyCur, "--socket", old.socket).CombinedOutput(); err != nil {
		t.Fatalf("migrate from the old host: %v\n%s\n%s", err, out, old.logTail())
	}
	onOld := output(t, old.stdout(img))
	atPark := last(onOld)
	ls := waitLines(t, cur.stdout(img), "a line verified on the new host", func(ls []line) bool {
		return len(ls) > 0 && last(ls).VerifiedAt > atPark.Counter
	})
	checkOneProcess(t, append(append([]line(nil), onOld...), ls...))
	r, err := cur.run(ctx, img)
	if err != nil || r.Phase != "executing" || r.Status != "running" || r.Segments != 3 {
		t.Fatalf("on the new host: %+v, %v", r, err)
	}
	rec := recordedManifest(t, cur, img)
	if _, flags := rec[manifest.CPUFlags]; rec.Version() != manifest.Format1 || rec[manifest.CPUFeatures] == "" || flags {
		t.Fatalf("the old host's park recorded %v: want format 1, the CPU as cpu.features", rec)
	}
	if v, err := cur.c.Verify(ctx, img); err != nil || !v.OK {
		t.Fatalf("verify on the new host: %+v, %v", v, err)
	}

	// New to old: refused before anything moves.
	_, err = cur.c.Migrate(ctx, img, keyOld)
	ae := apiError(t, err, api.CodeManifestMismatch)
	if !strings.Contains(ae.Message, manifest.Domain+"2") || !strings.Contains(ae.Message, manifest.Domain+"1 only") {
		t.Fatalf("the refusal does not name the formats: %v", ae)
	}
	t.Logf("migration to the old host refused: %v", ae)
	if r, err := cur.run(ctx, img); err != nil || r.HandedOff || r.Status != "running" || r.Segments != 3 {
		t.Fatalf("after the refused migration, the new host holds %+v, %v", r, err)
	}

	// The old host refuses a format-2 manifest at import.
	_, atPark = park(t, cur, img)
	if rec := recordedManifest(t, cur, img); rec.Version() != manifest.Format2 {
		t.Fatalf("the new host's park recorded format %d: %v", rec.Version(), rec)
	}
	var b bytes.Buffer
	if err := cur.c.ExportCopy(ctx, img, &b); err != nil {
		t.Fatal(err)
	}
	was, err := old.run(ctx, img) // handed off by the first migration
	if err != nil || !was.HandedOff {
		t.Fatalf("the old host holds %+v, %v; want it handed off", was, err)
	}
	_, err = old.c.Import(ctx, &b, img)
	ae = apiError(t, err, api.CodeBadRequest)
	if !strings.Contains(ae.Message, manifest.Domain+"1") {
		t.Fatalf("the old host's refusal does not name the format it reads: %v", ae)
	}
	t.Logf("the old host refuses a format-2 bundle: %v", ae)
	unchanged(t, old, img, was)
	resume(t, cur, img, onOld, atPark)

	// New to old: a transcript run, format 1.
	const tr = "roll-transcript"
	trStart(t, cur, tr, trAgentImage, "STEPS=2")
	trParked(t, cur, tr, 2)
	if rec := recordedManifest(t, cur, tr); rec.Version() != manifest.Format1 {
		t.Fatalf("a transcript park recorded format %d: %v", rec.Version(), rec)
	}
	if _, err := cur.c.Migrate(ctx, tr, keyOld); err != nil {
		t.Fatalf("migrate a transcript run to the old host: %v\n%s", err, cur.logTail())
	}
	trParked(t, old, tr, 2)
	trPost(t, old, tr, "call-1", trResult(1))
	trParked(t, old, tr, 5)
	trPost(t, old, tr, "call-2", trResult(2))
	trClosed(t, old, tr)
	v, err := old.c.Verify(ctx, tr)
	if err != nil || !v.OK || v.Phase != "closed" || v.WaitProof.Verdict != "NonBlocking" {
		t.Fatalf("verify on the old host: %+v, %v", v, err)
	}
}

// buildPrevious builds runrecordd and its gate at previousVersion, from
// this repository's history (git archive), into a directory of t's, and
// returns the daemon's path. A clone without that commit (a shallow one)
// fails the test: the rolling upgrade needs the version it upgrades from.
func buildPrevious(t *testing.T) string {
	t.Helper()
	t0 := time.Now()
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		t.Fatal(err)
	}
	archive := exec.Command("git", "archive", "--format=tar", previousVersion)
	archive.Dir = moduleRoot
	tar, err := archive.Output()
	if err != nil {
		t.Fatalf("git archive %s: %v (the test builds the runrecordd a rolling upgrade starts from: it needs a clone with that commit, not a shallow one)", previousVersion, err)
	}
	untar := exec.Command("tar", "-x", "-C", src)
	untar.Stdin = bytes.NewReader(tar)
	if out, err := untar.CombinedOutput(); err != nil {
		t.Fatalf("tar -x: %v\n%s", err, out)
	}
	bin := filepath.Join(dir, "bin", "runrecordd")
	for _, b := range []struct{ out, pkg, cgo string }{{bin, "./cmd/runrecordd", ""}, {filepath.Join(dir, "bin", "runrecordd-gate"), "./cmd/runrecordd-gate", "0"}} {
		cmd := exec.Command("go", "build", "-o", b.out, b.pkg)
		cmd.Dir = src
		if b.cgo != "" {
			cmd.Env = append(os.Environ(), "CGO_ENABLED="+b.cgo)
		}
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build %s at %s: %v\n%s", b.pkg, previousVersion, err, out)
		}
	}
	t.Logf("built runrecordd at %.12s in %v", previousVersion, time.Since(t0).Round(time.Millisecond))
	return bin
}

// TestFleetKeyRotation rotates a fleet host's key as docs/operations.md
// says ("Rotating a host key"), with the CLI: the host drained (its
// transcript run goes to the other host), stopped, its host.key moved
// aside, the new key admitted, the host started, the old key revoked. The
// run carries an attestation of the old key: once the key is revoked, the
// rotated host refuses the run back (untrusted_signer: no longer trusted
// by membership), and the run stays on the other host, which finishes it
// there; after `trust add OLD` on the rotated host, another such run
// migrates to it and finishes there, its record signed by both keys.
func TestFleetKeyRotation(t *testing.T) {
	privileged(t)
	ctx := context.Background()
	f := fleetCluster(t)
	a, oldKey := f.hostWithout(t, "rot-a")
	b, _ := f.hostWithout(t, "rot-b")
	for _, d := range []*daemon{a, b} {
		mustImportImage(t, d, trAgentArchive, trAgentImage, trAgentDigest)
	}
	const refused, moved = "rot-refused", "rot-moved"
	for _, id := range []string{refused, moved} {
		trStart(t, a, id, trAgentImage, "STEPS=2")
		trParked(t, a, id, 2)
	}
	if out, err := exec.Command(daemonBinary, "drain", "--socket", a.socket).CombinedOutput(); err != nil ||
		!strings.Contains(string(out), "drained: 2 moved, 0 left here") {
		t.Fatalf("drain: %v\n%s\n%s", err, out, a.logTail())
	}

	mustStop(t, a)
	if err := os.Rename(filepath.Join(a.state, "host.key"), filepath.Join(a.root, "host.key.old")); err != nil {
		t.Fatal(err)
	}
	newKey := cli(t, "fleet", "key", "--state-dir", a.state)
	if newKey == oldKey {
		t.Fatalf("the new key is the old one: %s", newKey)
	}
	f.cli(t, "fleet", "admit", newKey, "--name", "rot-a-rotated")
	mustStart(t, a)
	f.cli(t, "fleet", "revoke", oldKey)
	if h, err := a.c.Host(ctx); err != nil || h.KeyID != newKey {
		t.Fatalf("the rotated host: %+v, %v; want key %s", h, err, newKey)
	}

	// Each run goes on on the other host first: a run handed back to the
	// host that handed it off must extend what that host holds.
	for _, id := range []string{refused, moved} {
		trParked(t, b, id, 2)
		trPost(t, b, id, "call-1", trResult(1))
		trParked(t, b, id, 5)
	}
	_, err := b.c.Migrate(ctx, refused, newKey)
	ae := apiError(t, err, api.CodeUntrustedSigner)
	if ae.Signer != oldKey {
		t.Fatalf("untrusted signer %s, want the old key %s: %v", ae.Signer, oldKey, ae)
	}
	t.Logf("a run signed by the revoked key, to the rotated host: %v", ae)
	trParked(t, b, refused, 5)
	trPost(t, b, refused, "call-2", trResult(2))
	trClosed(t, b, refused)

	cli(t, "trust", "add", oldKey, "--name", "rot-a before rotation", "--socket", a.socket)
	if _, err := b.c.Migrate(ctx, moved, newKey); err != nil {
		t.Fatalf("migrate to the rotated host trusting its old key: %v\n%s", err, b.logTail())
	}
	trParked(t, a, moved, 5)
	trPost(t, a, moved, "call-2", trResult(2))
	trClosed(t, a, moved)
	v, err := a.c.Verify(ctx, moved)
	if err != nil || !v.OK || v.WaitProof.Verdict != "NonBlocking" {
		t.Fatalf("verify on the rotated host: %+v, %v", v, err)
	}
	signers := map[string]bool{}
	for _, s := range v.Signers {
		signers[s.Key] = s.Trusted
	}
	if !signers[oldKey] || !signers[newKey] {
		t.Fatalf("signers %+v: want the old key and the new one, both trusted", v.Signers)
	}
}

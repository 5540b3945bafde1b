//go:build linux

package e2e

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// TestRefusals: each way a resume (or an append) must be refused is
// refused with its own error, changes nothing — the same head, the same
// segment count, the run still parked — and, once the input is put right,
// the run resumes and the oracle goes on as the same process.
func TestRefusals(t *testing.T) {
	privileged(t)
	t.Run("FlippedMemoryByte", testFlippedMemoryByte)
	t.Run("ManifestKeyChanged", testManifestKeyChanged)
	t.Run("EditedSegment", testEditedSegment)
	t.Run("AppendAfterClose", testAppendAfterClose)
}

// testFlippedMemoryByte flips one byte of the memory image in the store:
// precondition 1 refuses the resume (snapshot_mismatch); flipped back, the
// resume goes through. Its daemon rehashes every byte before a lazy
// restore (--lazy-served=false; a served one finds a lazy chunk's byte
// when it is first served: lazy_served_test.go).
func testFlippedMemoryByte(t *testing.T) {
	d := mustDaemon(t, "flip", func(d *daemon) { d.flags = []string{"--lazy-served=false"} })
	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	ctx := context.Background()
	const id = "flip"
	startOracle(t, d, id, oracleImage)
	p, atPark := park(t, d, id)
	was, err := d.run(ctx, id)
	if err != nil {
		t.Fatal(err)
	}

	// The memory image's largest file (the pages), from the Suspended
	// segment's snapshot and the memory directory object's listing.
	s := mustShow(t, d, id)
	susp := s.Segments[len(s.Segments)-1]
	if susp.Kind != "suspended" || susp.Snapshot != p.Snapshot {
		t.Fatalf("last segment %+v", susp)
	}
	_, mem := snapshotAddrs(t, susp.Snapshot)
	es, err := store.DecodeListing(d.object(t, mem))
	if err != nil {
		t.Fatal(err)
	}
	var pages store.Entry
	for _, e := range es {
		if e.Size > pages.Size {
			pages = e
		}
	}
	if pages.Size < 64<<20 {
		t.Fatalf("memory image %s: largest file %+v; want the 64 MiB buffer's pages", mem, pages)
	}
	path := d.objectPath(pages.Address.String())
	at := int64(pages.Size / 2)
	flip := func() {
		t.Helper()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		b := make([]byte, 1)
		if _, err := f.ReadAt(b, at); err != nil {
			t.Fatal(err)
		}
		b[0] ^= 0x20
		if _, err := f.WriteAt(b, at); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, fi.Mode().Perm()); err != nil {
			t.Fatal(err)
		}
	}
	flip()
	t.Logf("flipped byte %d of %s (%s in %s)", at, pages.Address, pages.Name, mem)

	_, err = d.c.Resume(ctx, id)
	ae := apiError(t, err, "snapshot_mismatch")
	t.Logf("refused as it should be: %v", ae)
	unchanged(t, d, id, was)
	// Verify rehashes every object the record reaches: it names the file.
	v, err := d.c.Verify(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if v.OK || v.Error == nil || v.Error.Code != "object_corrupt" || !bytes.Contains([]byte(v.Error.Message), []byte(pages.Address.String())) {
		t.Fatalf("verify with a flipped byte: %+v (error %+v)", v, v.Error)
	}

	flip()
	if got := d.object(t, pages.Address.String()); uint64(len(got)) != pages.Size {
		t.Fatalf("flipped back: %d bytes", len(got))
	}
	resume(t, d, id, nil, atPark)
}

// testManifestKeyChanged re-imports a different image under the name the
// run's unit uses: precondition 2 refuses the resume (manifest_mismatch
// listing image.digest); with the original re-imported, it goes through.
func testManifestKeyChanged(t *testing.T) {
	d := shared(t)
	ctx := context.Background()
	const id = "manifest"
	// A name of its own, so the other tests' image stays put.
	const image = "runrecordd.test/oracle-manifest:1"
	mustImportImage(t, d, oracleArchive, image, oracleDigest)
	startOracle(t, d, id, image)
	_, atPark := park(t, d, id)
	was, err := d.run(ctx, id)
	if err != nil {
		t.Fatal(err)
	}

	mustImportImage(t, d, variantArchive, image, variantDigest)
	_, err = d.c.Resume(ctx, id)
	ae := apiError(t, err, "manifest_mismatch")
	if !slices.Equal(ae.Keys, []string{"image.digest"}) {
		t.Fatalf("manifest mismatch keys %v, want [image.digest]: %v", ae.Keys, ae)
	}
	t.Logf("refused as it should be: %v", ae)
	unchanged(t, d, id, was)

	mustImportImage(t, d, oracleArchive, image, oracleDigest)
	resume(t, d, id, nil, atPark)
}

// testEditedSegment edits an earlier segment of a parked run in the
// stopped daemon's bbolt file — the Resumed segment's idle_uj, re-encoded
// so that it still decodes, the head stored beside it untouched — and
// starts the daemon again: precondition 3 refuses the resume
// (record_invalid naming that segment); with the byte put back, it goes
// through.
func testEditedSegment(t *testing.T) {
	d := mustDaemon(t, "edited")
	mustImportImage(t, d, oracleArchive, oracleImage, oracleDigest)
	ctx := context.Background()
	const id = "edited"
	startOracle(t, d, id, oracleImage)
	_, atPark := park(t, d, id)
	resume(t, d, id, nil, atPark)
	_, atPark = park(t, d, id)
	s := mustShow(t, d, id)
	const edited = 2
	if got, want := kinds(s.Segments), "executed suspended resumed executed suspended"; got != want {
		t.Fatalf("segments %s, want %s", got, want)
	}
	was := s.Run

	mustStop(t, d)
	restore := editSegment(t, d, id, edited, func(s *record.Segment) { s.IdleUJ++ })
	mustStart(t, d)
	// As the edit left it: a record that does not verify vouches for no
	// time (started, parked_at), the rest as it was.
	asEdited, err := d.run(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if asEdited.Head != was.Head || asEdited.Segments != was.Segments || asEdited.Status != was.Status || !asEdited.Started.IsZero() {
		t.Fatalf("the edited run lists as %+v; was %+v", asEdited, was)
	}

	_, err = d.c.Resume(ctx, id)
	ae := apiError(t, err, "record_invalid")
	if ae.Segment == nil || *ae.Segment != edited {
		t.Fatalf("record_invalid names segment %v, want %d: %v", ae.Segment, edited, ae)
	}
	t.Logf("refused as it should be: %v", ae)
	unchanged(t, d, id, asEdited)
	v, err := d.c.Verify(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if v.OK || v.Error == nil || v.Error.Code != "record_invalid" || v.Error.Segment == nil || *v.Error.Segment != edited {
		t.Fatalf("verify of the edited record: %+v (error %+v)", v, v.Error)
	}

	mustStop(t, d)
	restore()
	mustStart(t, d)
	unchanged(t, d, id, was)
	resume(t, d, id, nil, atPark)
}

// testAppendAfterClose closes a parked run: resume, park and close are
// refused (phase), the head does not move, and show and verify still work.
func testAppendAfterClose(t *testing.T) {
	d := shared(t)
	ctx := context.Background()
	const id = "closed"
	startOracle(t, d, id, oracleImage)
	park(t, d, id)
	c, err := d.c.Close(ctx, id, "e2e: closed while parked")
	if err != nil {
		t.Fatal(err)
	}
	if c.Phase != "closed" || c.Status != "closed" || c.Segments != 3 {
		t.Fatalf("closed %+v", c)
	}
	for _, op := range []struct {
		name string
		do   func() error
	}{
		{"resume", func() error { _, err := d.c.Resume(ctx, id); return err }},
		{"park", func() error { _, err := d.c.Park(ctx, id); return err }},
		{"close", func() error { _, err := d.c.Close(ctx, id, "again"); return err }},
	} {
		ae := apiError(t, op.do(), "phase")
		t.Logf("%s refused as it should be: %v", op.name, ae)
		unchanged(t, d, id, c)
	}
	s := mustShow(t, d, id)
	if got, want := kinds(s.Segments), "executed suspended closed"; got != want || s.Segments[2].Reason != "e2e: closed while parked" {
		t.Fatalf("segments %s (%+v), want %s", got, s.Segments[2], want)
	}
	if err := verifyRun(ctx, d, id); err != nil {
		t.Fatal(err)
	}
}

// editSegment rewrites segment index of run id in a stopped daemon's
// records.db (internal/store's schema): the segment decoded, changed by edit
// and encoded again, so it still decodes, with the head stored beside it
// left as it was. It returns a function that puts the original back.
func editSegment(t *testing.T, d *daemon, id string, index uint64, edit func(*record.Segment)) (restore func()) {
	t.Helper()
	path := filepath.Join(d.state, "store", "records.db")
	var key, orig []byte
	update(t, path, func(tx *bolt.Tx) error {
		st := tx.Bucket([]byte("runs")).Get([]byte(id))
		if len(st) != 123 || st[0] != 2 {
			return fmt.Errorf("run %s: state of %d bytes, not format 2", id, len(st))
		}
		// format ‖ unit ‖ grants ‖ head ‖ count ‖ phase ‖ last seq ‖
		// last kind ‖ idle total (docs/store.md)
		seq := binary.BigEndian.Uint64(st[106:114])
		log := tx.Bucket([]byte("log"))
		for seq != 0 {
			k := binary.BigEndian.AppendUint64(nil, seq)
			v := log.Get(k)
			// run id length ‖ run id ‖ index ‖ prev seq ‖ head ‖ segment
			n := int(v[0])
			if string(v[1:1+n]) != id {
				return fmt.Errorf("log entry %d belongs to run %q", seq, v[1:1+n])
			}
			p := v[1+n:]
			if binary.BigEndian.Uint64(p) != index {
				seq = binary.BigEndian.Uint64(p[8:])
				continue
			}
			seg, err := record.DecodeSegment(p[48:])
			if err != nil {
				return err
			}
			edit(&seg)
			canon, err := seg.Canonical()
			if err != nil {
				return err
			}
			if bytes.Equal(canon, p[48:]) {
				return fmt.Errorf("the edit changed nothing")
			}
			key, orig = k, bytes.Clone(v)
			return log.Put(k, append(bytes.Clone(v[:1+n+48]), canon...))
		}
		return fmt.Errorf("run %s has no segment %d", id, index)
	})
	t.Logf("edited segment %d of %s in %s", index, id, path)
	return func() {
		t.Helper()
		update(t, path, func(tx *bolt.Tx) error { return tx.Bucket([]byte("log")).Put(key, orig) })
	}
}

func update(t *testing.T, path string, fn func(tx *bolt.Tx) error) {
	t.Helper()
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	err = db.Update(fn)
	if cerr := db.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		t.Fatal(err)
	}
}

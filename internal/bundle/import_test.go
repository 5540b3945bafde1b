package bundle_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/bundletest"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// iopts are the import options of a host that trusts the trusted key and
// allows mounts under allow.
func iopts(allow ...string) bundle.ImportOptions {
	return bundle.ImportOptions{Options: opts(allow...)}
}

func mustImport(t testing.TB, st bundle.Store, raw []byte, o bundle.ImportOptions) bundle.Imported {
	t.Helper()
	im, err := bundle.Import(context.Background(), st, bytes.NewReader(raw), o)
	if err != nil {
		t.Fatal(err)
	}
	return im
}

// extend is b one interval on, signed by the trusted key.
func extend(t testing.TB, b *bundletest.Bundle, transcript string) *bundletest.Bundle {
	t.Helper()
	ext, err := b.Extend(trustedKey, []byte(transcript))
	if err != nil {
		t.Fatal(err)
	}
	return ext
}

// resumeHere stores ext's new segments over run in st, as a host that
// resumed the run and parked it again would have them.
func resumeHere(t testing.TB, st *store.Store, run string, ext *bundletest.Bundle) {
	t.Helper()
	sb, err := bundle.Stage(context.Background(), st, bytes.NewReader(ext.Tar(nil)), bundle.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if err := sb.Adopt(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	held, err := st.Run(run)
	if err != nil {
		t.Fatal(err)
	}
	var segs []record.Segment
	for i := held.Len; i < ext.Record.Len(); i++ {
		segs = append(segs, ext.Record.Segment(i))
	}
	if _, err := st.AppendAll(run, held.Head, segs...); err != nil {
		t.Fatal(err)
	}
}

func sameRecord(t testing.TB, st *store.Store, run string, want *record.Record) {
	t.Helper()
	got, err := st.Record(run)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.EncodeWire(), want.EncodeWire()) {
		t.Fatalf("run %s: %d segments at %s, want %d at %s", run, got.Len(), got.Head(), want.Len(), want.Head())
	}
}

// stateOf describes everything an import may change in st: its runs, how
// each is held, and the objects under dir.
func stateOf(t testing.TB, st *store.Store, dir string) string {
	t.Helper()
	if _, err := st.Check(context.Background()); err != nil {
		t.Fatal(err)
	}
	ids, err := st.AllRuns()
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, id := range ids {
		r, _ := st.Run(id)
		h, off, _ := st.HandedOff(id)
		ret, _ := st.RetentionOf(id)
		fmt.Fprintf(&b, "%s %s %d %v %+v %v\n", id, r.Head, r.Len, off, h, ret.Imported)
	}
	n, size := objects(t, dir)
	fmt.Fprintf(&b, "%d objects, %d bytes", n, size)
	return b.String()
}

// A run goes from one store to another and back, as a host hands it off
// and takes it back one interval on: each import stores the record the
// other host exported, every object with it, and the stores check.
func TestImportRoundTrip(t *testing.T) {
	a, _ := mustStore(t)
	b, _ := mustStore(t)
	forged := forge(t, nil)
	mustImport(t, a, forged.Tar(nil), iopts())
	out := mustExport(t, a, "forged", true)
	// Format 2: the objects, all small, in one pack.
	if m := members(t, out); !slices.Equal(m, []string{"bundle.json", "record.json", "pack/0"}) {
		t.Fatalf("members %v", m)
	}
	if _, _, objs := readBundle(t, out); len(objs) != len(forged.Objects) {
		t.Fatalf("%d objects packed, the run has %d", len(objs), len(forged.Objects))
	}
	im := mustImport(t, b, out, iopts())
	if im.Run != "forged" || im.Extended || im.Header.Copy || im.Objects != len(forged.Objects) || im.Bytes != bytesOf(forged) ||
		len(im.Signers) != 1 || !im.Signers[0].Trusted || im.Spec.Args[0] != "a" {
		t.Fatalf("%+v", im)
	}
	sameRecord(t, b, "forged", forged.Record)
	// Resumed on b, parked again, handed back.
	ext := extend(t, forged, "{\"t\":2}\n")
	resumeHere(t, b, "forged", ext)
	back := mustImport(t, a, mustExport(t, b, "forged", true), iopts())
	if !back.Extended || back.Record.Len() != 5 {
		t.Fatalf("%+v", back)
	}
	sameRecord(t, a, "forged", ext.Record)
	if _, off, _ := a.HandedOff("forged"); off {
		t.Fatal("taken back, and still handed off")
	}
	if _, off, _ := b.HandedOff("forged"); !off {
		t.Fatal("b exported the run, and still holds it")
	}
	for _, st := range []*store.Store{a, b} {
		if _, err := st.Check(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// An image run travels with its listings and their files, each after the
// files it lists, and its directory objects verify on the other host.
func TestImportRoundTripImage(t *testing.T) {
	core, pages := []byte("core"), []byte("pages")
	l, err := store.EncodeListing([]store.Entry{{Name: "core-1.img", Mode: 0o600, Size: 4, Address: record.Sum(core)},
		{Name: "pages-1.img", Mode: 0o600, Size: 5, Address: record.Sum(pages)}})
	if err != nil {
		t.Fatal(err)
	}
	img := forgeImage(t, l, core, pages)
	a, _ := mustStore(t)
	b, _ := mustStore(t)
	mustImport(t, a, img.Tar(nil), iopts())
	im := mustImport(t, b, mustExport(t, a, "image", false), iopts())
	if !im.Header.Copy || im.Objects != len(img.Objects) {
		t.Fatalf("%+v", im)
	}
	sameRecord(t, b, "image", img.Record)
	if err := b.VerifyDir(context.Background(), *im.Record.Segment(1).Snapshot.Root); err != nil {
		t.Fatal(err)
	}
	if h, off, _ := b.HandedOff("image"); !off || !h.Copy {
		t.Fatal("a copy is not held as one")
	}
}

// ID stores the run under another id; CheckID judges the id asked for
// before the bundle is read, and the bundle's own id after; Lock is taken
// on the id chosen, once, and released as Import returns.
func TestImportID(t *testing.T) {
	st, dir := mustStore(t)
	b := forge(t, nil)
	refused := errors.New("not an id here")
	check := func(id string) error {
		if strings.HasPrefix(id, "bad") {
			return refused
		}
		return nil
	}
	var locked []string
	held := false
	o := iopts()
	o.CheckID = check
	o.Lock = func(id string) func() {
		locked, held = append(locked, id), true
		return func() { held = false }
	}
	o.ID = "bad-id"
	before := stateOf(t, st, dir)
	if _, err := bundle.Import(context.Background(), st, iotestReader{t}, o); !errors.Is(err, refused) {
		t.Fatalf("an id refused: %v", err)
	}
	b.Run, o.ID = "bad-too", ""
	if _, err := bundle.Import(context.Background(), st, bytes.NewReader(b.Tar(nil)), o); !errors.Is(err, refused) {
		t.Fatalf("the bundle's id refused: %v", err)
	}
	if after := stateOf(t, st, dir); after != before || len(locked) != 0 {
		t.Fatalf("refused ids changed the store (%s, was %s), or locked %v", after, before, locked)
	}
	o.ID = "elsewhere"
	if im := mustImport(t, st, b.Tar(nil), o); im.Run != "elsewhere" || im.Header.Run != "bad-too" {
		t.Fatalf("%+v", im)
	}
	if len(locked) != 1 || locked[0] != "elsewhere" || held {
		t.Fatalf("locked %v, still held %v", locked, held)
	}
	if _, err := st.Run("elsewhere"); err != nil {
		t.Fatal(err)
	}
}

// iotestReader fails the test if the bundle is read.
type iotestReader struct{ t testing.TB }

func (r iotestReader) Read([]byte) (int, error) {
	r.t.Error("the bundle was read")
	return 0, errors.New("read")
}

// refusal is a bundle Import refuses while staging, before it reads the
// store for the run, with an error wrapping want (as errors.As for a
// *store.CorruptError).
type refusal struct {
	tar  func(t *testing.T) []byte
	lim  bundle.Limits
	want error
}

// anyCorrupt wants a *store.CorruptError.
var anyCorrupt = &store.CorruptError{}

func mounts(src string) []unit.Mount { return []unit.Mount{{Source: src, Target: "/m"}} }

func refusals() map[string]refusal {
	plain := func(edit func(*bundletest.Run)) func(t *testing.T) []byte {
		return func(t *testing.T) []byte { return forge(t, edit).Tar(nil) }
	}
	appended := func(seg record.Segment) func(t *testing.T) []byte {
		return func(t *testing.T) []byte {
			b := forge(t, nil)
			if _, err := b.Record.Append(seg); err != nil {
				t.Fatal(err)
			}
			return b.Tar(nil)
		}
	}
	return map[string]refusal{
		"untrusted signer":           {tar: plain(func(r *bundletest.Run) { r.Key = untrustedKey }), want: attest.ErrUntrusted},
		"attestation out of place":   {tar: plain(func(r *bundletest.Run) { r.Legacy = true }), want: attest.ErrPlace},
		"grant refused":              {tar: plain(func(r *bundletest.Run) { r.Grants.ReadOnly = mounts("/etc") }), want: bundle.ErrPolicy},
		"object over the limit":      {tar: plain(nil), lim: bundle.Limits{Object: 64}, want: bundle.ErrLimit},
		"bundle over the limit":      {tar: plain(nil), lim: bundle.Limits{Total: 64}, want: bundle.ErrLimit},
		"closed, not parked":         {tar: appended(record.Closure("done")), want: bundle.ErrMalformed},
		"executing, not parked":      {tar: func(t *testing.T) []byte { return executing(t).Tar(nil) }, want: bundle.ErrMalformed},
		"not a bundle":               {tar: func(*testing.T) []byte { return []byte("not a tar at all") }, want: bundle.ErrMalformed},
		"missing object":             {tar: func(t *testing.T) []byte { return without(forge(t, nil), 1).Tar(nil) }, want: store.ErrMissingObject},
		"bytes that are not its own": {tar: corrupt, want: anyCorrupt},
	}
}

// executing is a forged run resumed: not parked.
func executing(t *testing.T) *bundletest.Bundle {
	b := forge(t, nil)
	if _, err := b.Record.Append(record.Resumption(b.Record.Segment(1).Snapshot, 1, record.Estimated)); err != nil {
		t.Fatal(err)
	}
	return b
}

// without drops the transcript parked at segment i.
func without(b *bundletest.Bundle, i int) *bundletest.Bundle {
	b.Drop(*b.Record.Segment(i).Snapshot.Transcript)
	return b
}

// corrupt is a bundle whose transcript member holds other bytes.
func corrupt(t *testing.T) []byte {
	b := forge(t, nil)
	tr := *b.Record.Segment(1).Snapshot.Transcript
	for i := range b.Objects {
		if b.Objects[i].Addr == tr {
			b.Objects[i].Bytes = []byte("{\"t\":9}\n")
		}
	}
	return b.Tar(nil)
}

// Every refusal while staging leaves the store as it was: no run, no
// object, nothing staged, a store that checks; the lock is not taken.
func TestImportRefusals(t *testing.T) {
	for name, c := range refusals() {
		t.Run(name, func(t *testing.T) {
			st, dir := mustStore(t)
			mustImport(t, st, forge(t, func(r *bundletest.Run) { r.Spec = spec("held") }).Tar(nil), iopts())
			before := stateOf(t, st, dir)
			o := iopts()
			o.Limits = c.lim
			o.Lock = func(string) func() { t.Error("locked"); return func() {} }
			_, err := bundle.Import(context.Background(), st, bytes.NewReader(c.tar(t)), o)
			checkRefused(t, err, c.want)
			if after := stateOf(t, st, dir); after != before {
				t.Fatalf("refused import changed the store:\n%s\nwas\n%s", after, before)
			}
		})
	}
}

// checkRefused checks a refused import's error: want (anyCorrupt: a
// corrupt object), naming the untrusted signer or the misplaced segment
// when that is the refusal.
func checkRefused(t *testing.T, err, want error) {
	t.Helper()
	var ce *store.CorruptError
	var ue *attest.UntrustedError
	var pe *attest.PlaceError
	switch {
	case want == anyCorrupt:
		if !errors.As(err, &ce) {
			t.Fatalf("got %v, want a corrupt object", err)
		}
	case !errors.Is(err, want):
		t.Fatalf("got %v, want %v", err, want)
	case errors.Is(err, attest.ErrUntrusted) && (!errors.As(err, &ue) || ue.Key != attest.KeyID(untrustedKey.Public().(ed25519.PublicKey))):
		t.Fatalf("%v names no signer, or another", err)
	case errors.Is(err, attest.ErrPlace) && (!errors.As(err, &pe) || pe.Index != 1):
		t.Fatalf("%v names no segment, or another", err)
	}
	t.Log(err)
}

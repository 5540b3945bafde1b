package bundle_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/bundletest"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

var (
	trustedKey   = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{1}, 32))
	untrustedKey = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{2}, 32))
)

func trusted(k record.Address) bool {
	return k == attest.KeyID(trustedKey.Public().(ed25519.PublicKey))
}

func spec(arg string) unit.Spec {
	return unit.Spec{Image: "example/unit:1", ImageDigest: "sha256:" + strings.Repeat("a", 64), Mode: unit.TranscriptMode, Args: []string{arg}}
}

// forge is a parked transcript run signed by the trusted key.
func forge(t testing.TB, edit func(*bundletest.Run)) *bundletest.Bundle {
	t.Helper()
	r := bundletest.Run{Spec: spec("a"), Grants: unit.Grants{Network: unit.NoNetwork}, Key: trustedKey, Transcript: []byte("{\"t\":1}\n"),
		Calls: []protocol.Call{{ID: "c1", Kind: "http", Payload: []byte(`{"url":"x"}`)}}}
	if edit != nil {
		edit(&r)
	}
	b, err := r.Forge("forged")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// objects counts the objects in a store directory (staging excluded) and
// the bytes under objects/, staging included.
func objects(t testing.TB, dir string) (n int, bytes int64) {
	t.Helper()
	root := filepath.Join(dir, "objects")
	filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return nil
		}
		if fi, err := d.Info(); err == nil {
			bytes += fi.Size()
		}
		if !strings.HasPrefix(p, filepath.Join(root, "tmp")+"/") {
			n++
		}
		return nil
	})
	return n, bytes
}

// mustStore opens a store in a temporary directory, checked
// (store.Check) when the test ends.
func mustStore(t testing.TB) (*store.Store, string) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		// Whatever a test imported or refused, every record verifies
		// from genesis and every object it reaches is whole.
		if _, err := st.Check(context.Background()); err != nil {
			t.Errorf("cleanup check: %v", err)
		}
		st.Close()
	})
	return st, dir
}

func opts(allow ...string) bundle.Options {
	return bundle.Options{Trusted: trusted, Policy: &bundle.Policy{AllowMounts: allow, StateDir: "/var/lib/runrecordd"}}
}

func TestStageAccepts(t *testing.T) {
	st, dir := mustStore(t)
	allowed := t.TempDir()
	b := forge(t, func(r *bundletest.Run) {
		r.Grants.ReadOnly = []unit.Mount{{Source: allowed, Target: "/data"}}
	})
	sb, err := bundle.Stage(context.Background(), st, bytes.NewReader(b.Tar(nil)), opts(allowed))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if len(sb.Signers) != 1 || !sb.Signers[0].Trusted || sb.Objects != len(b.Objects) || sb.Grants.ReadOnly[0].Source != allowed {
		t.Fatalf("%+v", sb)
	}
	if err := sb.Adopt(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	if n, _ := objects(t, dir); n != len(b.Objects) {
		t.Fatalf("%d objects stored, want %d", n, len(b.Objects))
	}
	for _, o := range b.Objects {
		if !st.Has(o.Addr) {
			t.Fatalf("%s not stored", o.Addr)
		}
	}
}

// A refused bundle leaves nothing: no object, nothing staged.
func TestStageRefuses(t *testing.T) {
	other := forge(t, func(r *bundletest.Run) { r.Spec = spec("other run") })
	allowed := t.TempDir()
	sock := filepath.Join(allowed, "s")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	link := filepath.Join(allowed, "link")
	os.Symlink("/etc", link)
	mount := func(src string) func(*bundletest.Run) {
		return func(r *bundletest.Run) { r.Grants.ReadOnly = []unit.Mount{{Source: src, Target: "/m"}} }
	}
	plain := func(edit func(*bundletest.Run)) func(t *testing.T) []byte {
		return func(t *testing.T) []byte { return forge(t, edit).Tar(nil) }
	}
	for name, c := range map[string]struct {
		tar  func(t *testing.T) []byte
		want error
		lim  bundle.Limits
	}{
		"untrusted signer":                 {tar: plain(func(r *bundletest.Run) { r.Key = untrustedKey }), want: attest.ErrUntrusted},
		"untrusted signer, as main signed": {tar: plain(func(r *bundletest.Run) { r.Key, r.Legacy = untrustedKey, true }), want: attest.ErrUntrusted},
		"tail not sealed":                  {tar: plain(func(r *bundletest.Run) { r.Legacy = true }), want: attest.ErrPlace},
		"spliced from another run": {tar: func(t *testing.T) []byte {
			b := forge(t, nil)
			// This run's unit, the other run's signed interval and park.
			rec := record.New(b.Record.Unit(), b.Record.Grants())
			for i := range other.Record.Len() {
				rec.Append(other.Record.Segment(i))
			}
			b.Record = rec
			for _, o := range other.Objects {
				b.Add(o.Bytes)
			}
			return stripUnreached(b).Tar(nil)
		}, want: attest.ErrPlace},
		"tail swapped": {tar: func(t *testing.T) []byte {
			b := forge(t, nil)
			susp := b.Record.Segment(1)
			evil := b.Add([]byte("another transcript\n"))
			rec := record.New(b.Record.Unit(), b.Record.Grants())
			rec.Append(b.Record.Segment(0))
			rec.Append(record.Suspension(record.TranscriptSnapshot(evil), susp.Manifest))
			b.Drop(*susp.Snapshot.Transcript)
			b.Record = rec
			return b.Tar(nil)
		}, want: attest.ErrPlace},
		"empty manifest":  {tar: plain(func(r *bundletest.Run) { r.Manifest = manifest.Manifest{} }), want: bundle.ErrMalformed},
		"mount /":         {tar: plain(mount("/")), want: bundle.ErrPolicy},
		"mount /proc/1":   {tar: plain(mount("/proc/1")), want: bundle.ErrPolicy},
		"mount state dir": {tar: plain(mount("/var/lib")), want: bundle.ErrPolicy},
		"mount elsewhere": {tar: plain(mount("/etc")), want: bundle.ErrPolicy},
		"mount via link":  {tar: plain(mount(link)), want: bundle.ErrPolicy},
		"mount a socket":  {tar: plain(mount(sock)), want: bundle.ErrPolicy},
		"sparse member": {tar: func(t *testing.T) []byte {
			const size = 64 << 20
			return forge(t, nil).Tar(func(h *bundle.Header) { h.Objects++; h.Bytes += size },
				bundletest.Sparse(bundletest.Name(bundletest.Zeros(size)), size))
		}, want: bundle.ErrMalformed},
		"unreached member": {tar: func(t *testing.T) []byte {
			b := forge(t, nil)
			b.Add([]byte("nobody names me"))
			return b.Tar(nil)
		}, want: bundle.ErrMalformed},
		"member larger than declared": {tar: func(t *testing.T) []byte {
			return forge(t, nil).Tar(func(h *bundle.Header) { h.Bytes -= 2 })
		}, want: bundle.ErrMalformed},
		"more members than declared": {tar: func(t *testing.T) []byte {
			return forge(t, nil).Tar(func(h *bundle.Header) { h.Objects-- })
		}, want: bundle.ErrMalformed},
		"a link member": {tar: func(t *testing.T) []byte {
			return forge(t, nil).Tar(nil, bundletest.Header("objects/"+strings.Repeat("A", 43), 0, '2'))
		}, want: bundle.ErrMalformed},
		"object before its refs": {tar: func(t *testing.T) []byte {
			b := forge(t, nil)
			att := b.Record.Segment(0).Attestation
			first := bundletest.Object{Addr: att, Bytes: b.Object(att)}
			b.Drop(att)
			b.Objects = append([]bundletest.Object{first}, b.Objects...)
			return b.Tar(nil)
		}, want: bundle.ErrMalformed},
		"a field bundle.json does not have": {tar: func(t *testing.T) []byte {
			b := forge(t, nil)
			return tarWith(b, fmt.Appendf(nil, `{"format":%q,"run":"forged","objects":%d,"bytes":%d,"signed":true}`, bundle.Format, len(b.Objects), bytesOf(b)))
		}, want: bundle.ErrMalformed},
		"a field bundle.json spells otherwise": {tar: func(t *testing.T) []byte {
			b := forge(t, nil)
			return tarWith(b, fmt.Appendf(nil, `{"Format":%q,"run":"forged","objects":%d,"bytes":%d}`, bundle.Format, len(b.Objects), bytesOf(b)))
		}, want: bundle.ErrMalformed},
		"object missing": {tar: func(t *testing.T) []byte {
			b := forge(t, nil)
			b.Drop(*b.Record.Segment(1).Snapshot.Transcript)
			return b.Tar(nil)
		}, want: store.ErrMissingObject},
		"object over the limit": {tar: plain(nil), lim: bundle.Limits{Object: 64}, want: bundle.ErrLimit},
		"bundle over the limit": {tar: plain(nil), lim: bundle.Limits{Total: 64}, want: bundle.ErrLimit},
		"record over the limit": {tar: plain(nil), lim: bundle.Limits{JSON: 200}, want: bundle.ErrLimit},
		"decoded object over the limit": {tar: func(t *testing.T) []byte {
			// A manifest as large as an object may be, but it is decoded.
			return forge(t, func(r *bundletest.Run) {
				r.Manifest = manifest.Manifest{manifest.Arch: strings.Repeat("x", 4096), manifest.ImageDigest: "d", manifest.Protocol: "p"}
			}).Tar(nil)
		}, lim: bundle.Limits{JSON: 1024}, want: bundle.ErrLimit},
	} {
		t.Run(name, func(t *testing.T) {
			st, dir := mustStore(t)
			raw := c.tar(t)
			o := opts(allowed)
			o.Limits = c.lim
			_, err := bundle.Stage(context.Background(), st, bytes.NewReader(raw), o)
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			t.Log(err)
			if n, size := objects(t, dir); n != 0 || size != 0 {
				t.Fatalf("refused bundle left %d objects, %d bytes", n, size)
			}
		})
	}
}

// bundle.json states each of its fields once, and every one but copy:
// a header that leaves one out, states one twice or states null is
// refused, never read as a default.
func TestStageRefusesHeaderFields(t *testing.T) {
	b := forge(t, nil)
	full := fmt.Sprintf(`{"format":%q,"run":"forged","objects":%d,"bytes":%d}`, bundle.Format, len(b.Objects), bytesOf(b))
	for name, h := range map[string]string{
		"without run":     strings.Replace(full, `"run":"forged",`, ``, 1),
		"empty run":       strings.Replace(full, `"run":"forged"`, `"run":""`, 1),
		"without objects": strings.Replace(full, fmt.Sprintf(`"objects":%d,`, len(b.Objects)), ``, 1),
		"without bytes":   strings.Replace(full, fmt.Sprintf(`,"bytes":%d`, bytesOf(b)), ``, 1),
		"without format":  strings.Replace(full, fmt.Sprintf(`"format":%q,`, bundle.Format), ``, 1),
		"run twice":       strings.Replace(full, `"run":"forged"`, `"run":"other","run":"forged"`, 1),
		"copy twice":      strings.Replace(full, `}`, `,"copy":true,"copy":false}`, 1),
		"null run":        strings.Replace(full, `"run":"forged"`, `"run":null`, 1),
		"null copy":       strings.Replace(full, `}`, `,"copy":null}`, 1),
		"not an object":   `[` + full + `]`,
	} {
		if h == full {
			t.Fatalf("%s: the edit did nothing", name)
		}
		st, dir := mustStore(t)
		_, err := bundle.Stage(context.Background(), st, bytes.NewReader(tarWith(b, []byte(h))), opts())
		if !errors.Is(err, bundle.ErrMalformed) {
			t.Errorf("%s: got %v, want ErrMalformed", name, err)
		}
		if n, _ := objects(t, dir); n != 0 {
			t.Errorf("%s: refused bundle left %d objects", name, n)
		}
	}
	st, _ := mustStore(t)
	sb, err := bundle.Stage(context.Background(), st, bytes.NewReader(tarWith(b, []byte(full))), opts())
	if err != nil {
		t.Fatalf("the full header: %v", err)
	}
	sb.Close()
}

// bytesOf is what bundle.json declares as b's bytes: its objects' sizes.
func bytesOf(b *bundletest.Bundle) (n int64) {
	for _, o := range b.Objects {
		n += int64(len(o.Bytes))
	}
	return n
}

// tarWith is b's bundle with header as its bundle.json.
func tarWith(b *bundletest.Bundle, header []byte) []byte {
	out := bundletest.Member("bundle.json", header)
	out = append(out, bundletest.Member("record.json", b.Record.EncodeWire())...)
	for _, o := range b.Objects {
		out = append(out, bundletest.Member(bundletest.Name(o.Addr), o.Bytes)...)
	}
	return append(out, make([]byte, 1024)...)
}

// The exporter's bundle.json, as docs/bundle.md shows it, is read.
func TestStageReadsTheHeader(t *testing.T) {
	st, _ := mustStore(t)
	b := forge(t, nil)
	h := fmt.Appendf(nil, "{\n  \"format\": %q,\n  \"run\": \"forged\",\n  \"objects\": %d,\n  \"bytes\": %d,\n  \"copy\": true\n}", bundle.Format, len(b.Objects), bytesOf(b))
	sb, err := bundle.Stage(context.Background(), st, bytes.NewReader(tarWith(b, h)), opts())
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	if !sb.Header.Copy || sb.Header.Run != "forged" || sb.Bytes != bytesOf(b) || sb.Objects != len(b.Objects) {
		t.Fatalf("%+v", sb)
	}
}

// A bundle is whole: an object the record reaches must be a member even
// when the importing store holds it, so that import and verify --file (a
// scratch store) judge a bundle alike.
func TestStageNeedsEveryObject(t *testing.T) {
	st, dir := mustStore(t)
	b := forge(t, nil)
	sb, err := bundle.Stage(context.Background(), st, bytes.NewReader(b.Tar(nil)), opts())
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.Adopt(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	sb.Close()
	n0, _ := objects(t, dir)
	for _, a := range []record.Address{b.Record.Unit(), b.Record.Grants(), *b.Record.Segment(1).Snapshot.Transcript, b.Record.Segment(1).Manifest} {
		part := forge(t, nil)
		part.Drop(a)
		if _, err := bundle.Stage(context.Background(), st, bytes.NewReader(part.Tar(nil)), opts()); !errors.Is(err, store.ErrMissingObject) {
			t.Fatalf("without %s, held by the store: %v", a, err)
		}
		if n, _ := objects(t, dir); n != n0 {
			t.Fatalf("%d objects, had %d", n, n0)
		}
	}
}

// forgeImage is an image run parked once, signed by the trusted key: its
// snapshot the listing root (files added before it) and an empty memory
// listing.
func forgeImage(t testing.TB, root []byte, files ...[]byte) *bundletest.Bundle {
	t.Helper()
	b := &bundletest.Bundle{Run: "image"}
	sp := spec("image")
	sp.Mode = unit.ImageMode
	sc, err := sp.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	g := unit.Grants{Network: unit.NoNetwork}
	ua, ga := b.Add(sc), b.Add(g.Encode())
	rc, _ := (&attest.Receipt{Provenance: record.Estimated, Method: "forged", WindowNS: 1}).Canonical()
	var j attest.Journal
	rca, ja := b.Add(rc), b.Add(j.Encode())
	for _, f := range files {
		b.Add(f)
	}
	empty, _ := store.EncodeListing(nil)
	ra, mem := b.Add(root), b.Add(empty)
	m := manifest.Manifest{}
	for _, k := range manifest.ImageKeys {
		m[k] = "x"
	}
	mc, _ := m.Canonical()
	rec := record.New(ua, ga)
	susp := record.Suspension(record.ImageSnapshot(ra, &mem), b.Add(mc))
	c, _ := susp.Canonical()
	sig, err := attest.Sign(&attest.Body{Genesis: rec.Genesis(), Interval: 1, PrevHead: rec.Head(), StartNS: 1, EndNS: 2,
		Receipt: rca, Journal: ja, Outcome: attest.Outcome{Kind: attest.Parked, Suspends: record.Sum(c)}}, trustedKey)
	if err != nil {
		t.Fatal(err)
	}
	for _, seg := range []record.Segment{record.Execution(b.Add(sig.Encode()), nil), susp} {
		if _, err := rec.Append(seg); err != nil {
			t.Fatal(err)
		}
	}
	b.Record = rec
	return b
}

// An image run's listings: decoded, their files members before them, of
// the sizes listed.
func TestStageImage(t *testing.T) {
	core, pages := []byte("core"), []byte("pages")
	listing := func(es ...store.Entry) []byte {
		b, err := store.EncodeListing(es)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	good := listing(store.Entry{Name: "core-1.img", Mode: 0o600, Size: 4, Address: record.Sum(core)},
		store.Entry{Name: "pages-1.img", Mode: 0o600, Size: 5, Address: record.Sum(pages)})
	for name, c := range map[string]struct {
		b    func() *bundletest.Bundle
		want error
	}{
		"accepted": {b: func() *bundletest.Bundle { return forgeImage(t, good, core, pages) }},
		"a file missing": {b: func() *bundletest.Bundle {
			return forgeImage(t, good, core)
		}, want: store.ErrMissingObject},
		"a size listed wrong": {b: func() *bundletest.Bundle {
			return forgeImage(t, listing(store.Entry{Name: "core-1.img", Size: 5, Address: record.Sum(core)}), core)
		}, want: bundle.ErrMalformed},
		"a listing that does not decode": {b: func() *bundletest.Bundle {
			bad := append([]byte(store.DirDomain), 0, 0, 0, 1, 0, 0, 0, 4, 'a', '/', '/', 'b', 0, 0, 1, 0x80, 0, 0, 0, 0, 0, 0, 0, 4)
			a := record.Sum(core)
			return forgeImage(t, append(bad, a[:]...), core)
		}, want: bundle.ErrMalformed},
		"a listing before its files": {b: func() *bundletest.Bundle {
			b := forgeImage(t, good, core, pages)
			b.Drop(record.Sum(pages))
			b.Objects = append(b.Objects, bundletest.Object{Addr: record.Sum(pages), Bytes: pages})
			return b
		}, want: bundle.ErrMalformed},
	} {
		t.Run(name, func(t *testing.T) {
			st, dir := mustStore(t)
			sb, err := bundle.Stage(context.Background(), st, bytes.NewReader(c.b().Tar(nil)), opts())
			if !errors.Is(err, c.want) || (err == nil) != (c.want == nil) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			if err != nil {
				t.Log(err)
				if n, size := objects(t, dir); n != 0 || size != 0 {
					t.Fatalf("refused bundle left %d objects, %d bytes", n, size)
				}
				return
			}
			defer sb.Close()
			if err := sb.Adopt(context.Background(), st); err != nil {
				t.Fatal(err)
			}
			if err := st.VerifyDir(context.Background(), *sb.Record.Segment(1).Snapshot.Root); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Every listing a store may write is one a bundle importer decodes under
// the default limits.
func TestDefaultLimitsHoldAListing(t *testing.T) {
	if bundle.DefaultLimits.JSON < store.MaxListingBytes || bundle.DefaultLimits.Object < store.MaxListingBytes {
		t.Fatalf("limits %+v, a listing may have %d bytes", bundle.DefaultLimits, store.MaxListingBytes)
	}
}

// stripUnreached drops the objects b's record does not reach, as an
// honest exporter would not carry them.
func stripUnreached(b *bundletest.Bundle) *bundletest.Bundle {
	rec := b.Record
	need := map[record.Address]bool{rec.Unit(): true, rec.Grants(): true}
	for i := range rec.Len() {
		s := rec.Segment(i)
		switch s.Kind {
		case record.Executed:
			need[s.Attestation] = true
			if body, err := attest.Open(b.Object(s.Attestation), nil); err == nil {
				need[body.Receipt], need[body.Journal] = true, true
			}
		case record.Suspended:
			need[s.Manifest] = true
			for _, a := range s.Snapshot.Addresses() {
				need[a] = true
			}
		}
	}
	for _, o := range append([]bundletest.Object(nil), b.Objects...) {
		if !need[o.Addr] {
			b.Drop(o.Addr)
		}
	}
	return b
}

// FuzzImport feeds the bundle reader arbitrary streams against a scratch
// store: it never panics, never stages more than the stream's length, and
// either accepts a bundle whose every reached object it can adopt, or
// refuses leaving the store without objects.
func FuzzImport(f *testing.F) {
	good := forge(f, nil)
	f.Add(good.Tar(nil))
	f.Add(forge(f, func(r *bundletest.Run) { r.Key = untrustedKey }).Tar(nil))
	f.Add(forge(f, func(r *bundletest.Run) { r.Legacy = true }).Tar(nil))
	f.Add(good.Tar(func(h *bundle.Header) { h.Objects++; h.Bytes += 1 << 20 }, bundletest.Sparse(bundletest.Name(bundletest.Zeros(1<<20)), 1<<20)))
	f.Add(good.Tar(func(h *bundle.Header) { h.Bytes -= 2 }))
	// Format 2: the objects in a pack, or in two packs around a member.
	objs := all(good)
	f.Add(tar2(good, nil, bundletest.Member("pack/0", packOf(objs...))))
	f.Add(tar2(good, nil, bundletest.Member("pack/0", packOf(objs[:2]...)), bundletest.Member(bundletest.Name(good.Objects[2].Addr), objs[2]),
		bundletest.Member("pack/1", packOf(objs[3:]...))))
	f.Add([]byte{})
	// One store for every input: opening one is a few fsyncs, and the
	// fuzzer runs (and minimizes) thousands of inputs.
	st, dir := mustStore(f)
	f.Fuzz(func(t *testing.T, raw []byte) {
		o := opts()
		o.Limits = bundle.Limits{Object: 1 << 20, Total: 4 << 20, JSON: 1 << 20}
		n0, size0 := objects(t, dir)
		sb, err := bundle.Stage(context.Background(), st, bytes.NewReader(raw), o)
		if err != nil {
			if n, size := objects(t, dir); n != n0 || size != size0 {
				t.Fatalf("refused (%v), left %d objects, %d bytes (had %d, %d)", err, n, size, n0, size0)
			}
			return
		}
		defer sb.Close()
		if sb.Bytes > int64(len(raw)) {
			t.Fatalf("staged %d bytes from a stream of %d", sb.Bytes, len(raw))
		}
		if err := sb.Adopt(context.Background(), st); err != nil {
			t.Fatal(err)
		}
		if _, err := attest.CheckRecord(sb.Record, st.ReadAll, trusted); err != nil {
			t.Fatalf("accepted a record whose attestations do not check: %v", err)
		}
	})
}

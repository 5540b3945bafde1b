package transfer_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/runrecordd/runrecordd/internal/fleet/transfer"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// fetchAll fetches rec's objects from srv into st and checks what it
// counted against want (objects and bytes fetched, skipped).
func fetchAll(t *testing.T, srv string, st *store.Store, rec *record.Record, want transfer.Stats) {
	t.Helper()
	got, err := transfer.Fetch(context.Background(), transfer.Source{Client: http.DefaultClient, Base: srv}, st, rec, transfer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got != want {
		t.Fatalf("stats %+v, want %+v", got, want)
	}
}

// statsOf is what fetching objs from src into an empty store counts.
func statsOf(t *testing.T, src *store.Store, objs []record.Address) transfer.Stats {
	t.Helper()
	s := transfer.Stats{Objects: len(objs)}
	for _, a := range objs {
		n, err := src.Size(a)
		if err != nil {
			t.Fatal(err)
		}
		s.Bytes += n
	}
	return s
}

// A run's objects move from A into an empty B: afterwards B holds every
// object the record reaches, with the refs A holds them with, so that the
// record imported into B passes Check; a second fetch moves nothing.
func TestFetch(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, a *store.Store) *record.Record
	}{
		{"transcript", func(t *testing.T, a *store.Store) *record.Record { return transcriptRun(t, a, "r1") }},
		{"image", func(t *testing.T, a *store.Store) *record.Record {
			return imageRun(t, a, "r1",
				map[string][]byte{"core-1.img": []byte("core"), "pages-1.img": []byte("pages"), "sub/dir/x": []byte("x")},
				map[string][]byte{"mem-1.img": []byte("memory"), "core-1.img": []byte("core")})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a, b := mustStore(t), mustStore(t)
			rec := tc.run(t, a)
			srv := serve(t, a, nil)
			objs := reached(t, a, rec)
			fetchAll(t, srv.URL, b, rec, statsOf(t, a, objs))
			if got := reached(t, b, rec); !sameSet(got, objs) || len(held(b, got)) != len(objs) {
				t.Fatalf("B reaches %d objects (%d held), A %d", len(got), len(held(b, got)), len(objs))
			}
			for _, o := range objs {
				ra, _ := a.Refs(o)
				rb, _ := b.Refs(o)
				if !sameSet(ra, rb) {
					t.Fatalf("%s: refs %v in B, %v in A", o, rb, ra)
				}
			}
			if err := b.Import("r1", rec); err != nil {
				t.Fatal(err)
			}
			if _, err := b.Check(context.Background()); err != nil {
				t.Fatal(err)
			}
			fetchAll(t, srv.URL, b, rec, transfer.Stats{Skipped: len(objs)})
		})
	}
}

// Only what the target lacks for the run moves: r1, fetched and imported
// into B, parked again on A with the same files, fetches only its new
// objects; the objects r1's record held in B reaches are not fetched.
func TestFetchOnlyMissing(t *testing.T) {
	a, b := mustStore(t), mustStore(t)
	files := map[string][]byte{"core-1.img": []byte("core"), "pages-1.img": []byte("pages")}
	r1 := imageRun(t, a, "r1", files, map[string][]byte{"m": []byte("m1")})
	srv := serve(t, a, nil)
	fetchAll(t, srv.URL, b, r1, statsOf(t, a, reached(t, a, r1)))
	if err := b.Import("r1", r1); err != nil {
		t.Fatal(err)
	}
	r2 := parkAgain(t, a, "r1", ingest(t, a, files), ingest(t, a, map[string][]byte{"m": []byte("m2")}))
	var fresh []record.Address
	for _, o := range reached(t, a, r2) {
		if !b.Has(o) {
			fresh = append(fresh, o)
		}
	}
	if len(fresh) == 0 || len(fresh) == len(reached(t, a, r2)) {
		t.Fatalf("%d of r2's objects are new: the records should share some", len(fresh))
	}
	want := statsOf(t, a, fresh)
	want.Skipped = len(reached(t, a, r2)) - len(fresh)
	fetchAll(t, srv.URL, b, r2, want)
	if err := b.HandOff("r1", r1.Head()); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Extend("r1", r2, false, false); err != nil {
		t.Fatal(err)
	}
}

// parkAgain resumes run id (rec, parked) in st and parks it again as an
// image of root and memory, as a daemon would; it returns the record.
func parkAgain(t testing.TB, st *store.Store, id string, root, memory record.Address) *record.Record {
	t.Helper()
	rec, err := st.Record(id)
	if err != nil {
		t.Fatal(err)
	}
	head := rec.Head()
	last := rec.Segment(rec.Len() - 1)
	segs := []record.Segment{record.Resumption(last.Snapshot, 1, record.Estimated)}
	if _, err := rec.Append(segs[0]); err != nil {
		t.Fatal(err)
	}
	rc, _ := (&attest.Receipt{Provenance: record.Estimated, Method: "test", WindowNS: 2}).Canonical()
	var j attest.Journal
	rca, ja := mustPut(t, st, rc), mustPut(t, st, j.Encode())
	susp := record.Suspension(record.ImageSnapshot(root, &memory), last.Manifest)
	c, _ := susp.Canonical()
	sig, err := attest.Sign(&attest.Body{Genesis: rec.Genesis(), Interval: 2, PrevHead: rec.Head(), StartNS: 3, EndNS: 4,
		Receipt: rca, Journal: ja, Outcome: attest.Outcome{Kind: attest.Parked, Suspends: record.Sum(c)}}, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, seg := range []record.Segment{record.Execution(mustPut(t, st, sig.Encode(), rca, ja), nil), susp} {
		if _, err := rec.Append(seg); err != nil {
			t.Fatal(err)
		}
		segs = append(segs, seg)
	}
	if _, err := st.AppendAll(id, head, segs...); err != nil {
		t.Fatal(err)
	}
	return rec
}

// An attestation or listing the target holds already, without the refs its
// bytes give (put by other means), gets them: what it names is fetched and
// declared.
func TestFetchHeldWithoutRefs(t *testing.T) {
	a, b := mustStore(t), mustStore(t)
	rec := imageRun(t, a, "r1", map[string][]byte{"core-1.img": []byte("core")}, map[string][]byte{"m": []byte("m")})
	root := *rec.Segment(1).Snapshot.Root
	lb, err := a.ReadAll(root)
	if err != nil {
		t.Fatal(err)
	}
	mustPut(t, b, lb)
	srv := serve(t, a, nil)
	if _, err := transfer.Fetch(context.Background(), transfer.Source{Client: http.DefaultClient, Base: srv.URL}, b, rec, transfer.Options{}); err != nil {
		t.Fatal(err)
	}
	ra, _ := a.Refs(root)
	rb, _ := b.Refs(root)
	if len(ra) == 0 || !sameSet(ra, rb) {
		t.Fatalf("listing's refs in B %v, in A %v", rb, ra)
	}
	if err := b.Import("r1", rec); err != nil {
		t.Fatal(err)
	}
}

// noneAdopted checks that a fetch refused at bad (an object the record
// reaches, objs) left B as it was: none of the record's objects, nothing
// at all in this test's empty store, nothing left staged.
func noneAdopted(t *testing.T, b *store.Store, objs []record.Address, bad record.Address) {
	t.Helper()
	if !slices.Contains(objs, bad) {
		t.Fatalf("%s is not reached", bad)
	}
	if got := held(b, objs); len(got) != 0 {
		t.Fatalf("B holds %d of the record's objects after a refused fetch, want none", len(got))
	}
	if n := stored(t, b); n != 0 {
		t.Fatalf("B holds %d objects after a refused fetch, want none", n)
	}
	if es, _ := os.ReadDir(filepath.Join(b.Dir(), "objects", "tmp")); len(es) != 0 {
		t.Fatalf("a refused fetch left %d entries in staging", len(es))
	}
}

// A peer that lacks an object the record reaches: ErrAbsent, and nothing
// from it on is adopted.
func TestFetchAbsent(t *testing.T) {
	a, b := mustStore(t), mustStore(t)
	rec := imageRun(t, a, "r1", map[string][]byte{"core-1.img": []byte("core"), "pages-1.img": []byte("pages")}, map[string][]byte{"m": []byte("m")})
	objs := reached(t, a, rec)
	// A listed file the peer lost: its listing names a file not present.
	root := *rec.Segment(1).Snapshot.Root
	es, err := a.Listing(root)
	if err != nil {
		t.Fatal(err)
	}
	gone := es[1].Address
	if err := os.Remove(a.Path(gone)); err != nil {
		t.Fatal(err)
	}
	srv := serve(t, a, nil)
	_, err = transfer.Fetch(context.Background(), transfer.Source{Client: http.DefaultClient, Base: srv.URL}, b, rec, transfer.Options{})
	if !errors.Is(err, transfer.ErrAbsent) {
		t.Fatalf("fetch: %v, want ErrAbsent", err)
	}
	noneAdopted(t, b, objs, gone)
	if b.Has(root) {
		t.Fatal("the listing naming a missing file was adopted")
	}
	// Put back, the fetch completes.
	mustPut(t, a, []byte("pages"))
	if _, err := transfer.Fetch(context.Background(), transfer.Source{Client: http.DefaultClient, Base: srv.URL}, b, rec, transfer.Options{}); err != nil {
		t.Fatal(err)
	}
	if err := b.Import("r1", rec); err != nil {
		t.Fatal(err)
	}
}

// Objects whose bytes are not what the record says they are: a listing
// giving a file another size than its object's, an "attestation" that is
// not one.
func TestFetchMalformed(t *testing.T) {
	t.Run("listed size", func(t *testing.T) {
		a, b := mustStore(t), mustStore(t)
		core := mustPut(t, a, []byte("core"))
		lb, err := store.EncodeListing([]store.Entry{{Name: "core-1.img", Mode: 0o600, Size: 5, Address: core}})
		if err != nil {
			t.Fatal(err)
		}
		root := mustPut(t, a, lb, core)
		mem := ingest(t, a, map[string][]byte{"m": []byte("m")})
		rec := parkedImage(t, a, "r1", mustPut(t, a, []byte("unit")), mustPut(t, a, []byte("grants")), root, mem)
		srv := serve(t, a, nil)
		_, err = transfer.Fetch(context.Background(), transfer.Source{Client: http.DefaultClient, Base: srv.URL}, b, rec, transfer.Options{})
		if !errors.Is(err, transfer.ErrMalformed) {
			t.Fatalf("fetch: %v, want ErrMalformed", err)
		}
		noneAdopted(t, b, reached(t, a, rec), core)
	})
	t.Run("attestation", func(t *testing.T) {
		a, b := mustStore(t), mustStore(t)
		ua, ga, att := mustPut(t, a, []byte("unit")), mustPut(t, a, []byte("grants")), mustPut(t, a, []byte("not an attestation"))
		rec := record.New(ua, ga)
		if _, err := rec.Append(record.Execution(att, nil)); err != nil {
			t.Fatal(err)
		}
		srv := serve(t, a, nil)
		_, err := transfer.Fetch(context.Background(), transfer.Source{Client: http.DefaultClient, Base: srv.URL}, b, rec, transfer.Options{})
		if !errors.Is(err, transfer.ErrMalformed) {
			t.Fatalf("fetch: %v, want ErrMalformed", err)
		}
		if b.Has(att) {
			t.Fatal("adopted")
		}
	})
}

// A fetch uses one connection for all its objects: each body is read to
// its end (a new connection per object would be a TLS handshake each on
// the peer listener).
func TestFetchOneConnection(t *testing.T) {
	a, b := mustStore(t), mustStore(t)
	rec := imageRun(t, a, "r1", map[string][]byte{"core-1.img": []byte("core"), "pages-1.img": []byte("pages")}, map[string][]byte{"m": []byte("m")})
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(transfer.Handler(a))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	c := &http.Client{Transport: &http.Transport{}}
	t.Cleanup(c.CloseIdleConnections)
	s, err := transfer.Fetch(context.Background(), transfer.Source{Client: c, Base: srv.URL}, b, rec, transfer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if n := conns.Load(); n != 1 || s.Objects < 10 {
		t.Fatalf("%d objects over %d connections", s.Objects, n)
	}
}

// A fetch whose context ends stops there: what it adopted is whole, and
// nothing is left in staging (mustStore).
func TestFetchCanceled(t *testing.T) {
	a, b := mustStore(t), mustStore(t)
	rec := transcriptRun(t, a, "r1")
	objs := reached(t, a, rec)
	stop := objs[3]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv := serve(t, a, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/objects/"+stop.String() {
				cancel()
			}
			h.ServeHTTP(w, r)
		})
	})
	_, err := transfer.Fetch(ctx, transfer.Source{Client: http.DefaultClient, Base: srv.URL}, b, rec, transfer.Options{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("fetch: %v, want context.Canceled", err)
	}
	noneAdopted(t, b, objs, stop)
}

// Knowing an address is not holding its bytes: B holds run v's memory; a
// record of another run (another genesis) naming that memory is fetched
// whole from its peer, which must send it — a peer without it is refused
// (ErrAbsent), and with it every object moves again, none skipped.
func TestFetchClaimNotHeld(t *testing.T) {
	a, b := mustStore(t), mustStore(t)
	files := map[string][]byte{"core-1.img": []byte("core")}
	mem := map[string][]byte{"pages-1.img": []byte("the victim's pages")}
	v := imageRun(t, b, "v", files, mem)
	rec := imageRun(t, a, "r2", files, mem)
	memory := *rec.Segment(1).Snapshot.Memory
	if *v.Segment(1).Snapshot.Memory != memory || v.Genesis() == rec.Genesis() {
		t.Fatal("the runs should share their memory, not their genesis")
	}
	es, err := a.Listing(memory)
	if err != nil {
		t.Fatal(err)
	}
	claimed := []record.Address{memory}
	for _, e := range es {
		claimed = append(claimed, e.Address)
	}
	srv := serve(t, a, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			for _, c := range claimed {
				if path.Base(r.URL.Path) == c.String() {
					http.NotFound(w, r)
					return
				}
			}
			h.ServeHTTP(w, r)
		})
	})
	src := transfer.Source{Client: http.DefaultClient, Base: srv.URL}
	f, _, err := transfer.Stage(context.Background(), src, b, rec, transfer.Options{})
	if err == nil {
		f.Close()
	}
	if !errors.Is(err, transfer.ErrAbsent) {
		t.Fatalf("stage of a record claiming another run's memory: %v, want ErrAbsent", err)
	}
	fetchAll(t, serve(t, a, nil).URL, b, rec, statsOf(t, a, reached(t, a, rec)))
	if err := b.Import("r2", rec); err != nil {
		t.Fatal(err)
	}
}

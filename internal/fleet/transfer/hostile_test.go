package transfer_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strconv"
	"testing"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/fleet/transfer"
	"github.com/runrecordd/runrecordd/internal/park"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// attack answers GET /v1/objects/{target} in place of the store; b are
// the object's true bytes.
type attack func(w http.ResponseWriter, b []byte)

var attacks = map[string]struct {
	answer attack
	is     error
}{
	// Other bytes of the same length: they hash to another address.
	"other bytes": {func(w http.ResponseWriter, b []byte) {
		o := bytes.Clone(b)
		o[len(o)/2] ^= 0xff
		w.Header().Set("Content-Length", strconv.Itoa(len(o)))
		w.Write(o)
	}, store.ErrCorrupt},
	// The declared length, then half the bytes and a closed connection.
	"truncated": {func(w http.ResponseWriter, b []byte) {
		w.Header().Set("Content-Length", strconv.Itoa(len(b)))
		w.Write(b[:len(b)/2])
		w.(http.Flusher).Flush()
		panic(http.ErrAbortHandler)
	}, transfer.ErrTruncated},
	// 5 GiB declared, over the object limit: refused before a byte is read.
	"oversize": {func(w http.ResponseWriter, b []byte) {
		w.Header().Set("Content-Length", strconv.FormatInt(5<<30, 10))
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		w.Write(b)
		panic(http.ErrAbortHandler)
	}, transfer.ErrLimit},
	// A chunked body, no length declared.
	"no length": {func(w http.ResponseWriter, b []byte) {
		w.Write(b)
		w.(http.Flusher).Flush()
	}, transfer.ErrPeer},
	// The true bytes and one more: another length than the true one.
	"longer": {func(w http.ResponseWriter, b []byte) {
		o := append(bytes.Clone(b), 0)
		w.Header().Set("Content-Length", strconv.Itoa(len(o)))
		w.Write(o)
	}, nil},
	"server error": {func(w http.ResponseWriter, b []byte) {
		http.Error(w, "no", http.StatusInternalServerError)
	}, transfer.ErrPeer},
}

// hostile serves st's objects, and target by answer.
func hostile(st *store.Store, target record.Address, answer attack) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/v1/objects/"+target.String() {
				h.ServeHTTP(w, r)
				return
			}
			b, err := st.ReadAll(target)
			if err != nil {
				panic(err)
			}
			answer(w, b)
		})
	}
}

// Every attack on every kind of object — a plain object (the journal, a
// listed file), a document (the attestation, a listing) — is refused with
// its typed error: the object is not adopted, nor anything after it; what
// came before it is whole (B passes Check: mustStore).
func TestFetchHostile(t *testing.T) {
	files := map[string][]byte{"core-1.img": []byte("core image"), "pages-1.img": bytes.Repeat([]byte("p"), 3<<20)}
	targets := map[string]func(rec *record.Record, a *store.Store) record.Address{
		"journal": func(rec *record.Record, a *store.Store) record.Address {
			refs, _ := a.Refs(rec.Segment(0).Attestation)
			return refs[1]
		},
		"attestation": func(rec *record.Record, a *store.Store) record.Address { return rec.Segment(0).Attestation },
		"listing":     func(rec *record.Record, a *store.Store) record.Address { return *rec.Segment(1).Snapshot.Root },
		"listed file": func(rec *record.Record, a *store.Store) record.Address {
			es, _ := a.Listing(*rec.Segment(1).Snapshot.Root)
			return es[1].Address // pages-1.img, 3 MiB
		},
	}
	for name, at := range attacks {
		for tname, target := range targets {
			t.Run(name+"/"+tname, func(t *testing.T) {
				a, b := mustStore(t), mustStore(t)
				rec := imageRun(t, a, "r1", files, map[string][]byte{"m": []byte("m")})
				bad := target(rec, a)
				srv := serve(t, a, hostile(a, bad, at.answer))
				_, err := transfer.Fetch(context.Background(), transfer.Source{Client: http.DefaultClient, Base: srv.URL}, b, rec, transfer.Options{})
				want := at.is
				if want == nil { // another length: a listing says what a file's is
					want = store.ErrCorrupt
					if tname == "listed file" {
						want = transfer.ErrMalformed
					}
				}
				if !errors.Is(err, want) {
					t.Fatalf("fetch: %v, want %v", err, want)
				}
				noneAdopted(t, b, reached(t, a, rec), bad)
			})
		}
	}
}

// A fetch's limits: one object, a document decoded, all bytes.
func TestFetchLimits(t *testing.T) {
	a := mustStore(t)
	rec := imageRun(t, a, "r1", map[string][]byte{"big": bytes.Repeat([]byte("b"), 1<<20)}, map[string][]byte{"m": []byte("m")})
	srv := serve(t, a, nil)
	for name, lim := range map[string]transfer.Options{
		"object": {Limits: limits(1<<20-1, 0, 0)},
		"json":   {Limits: limits(0, 0, 100)},
		"total":  {Limits: limits(0, 1<<20, 0)},
	} {
		t.Run(name, func(t *testing.T) {
			b := mustStore(t)
			_, err := transfer.Fetch(context.Background(), transfer.Source{Client: http.DefaultClient, Base: srv.URL}, b, rec, lim)
			if !errors.Is(err, transfer.ErrLimit) {
				t.Fatalf("fetch: %v, want ErrLimit", err)
			}
		})
	}
	b := mustStore(t)
	if _, err := transfer.Fetch(context.Background(), transfer.Source{Client: http.DefaultClient, Base: srv.URL}, b, rec, transfer.Options{Limits: limits(1<<20, 2<<20, 0)}); err != nil {
		t.Fatalf("within the limits: %v", err)
	}
}

// A fetch is held to what an import holds a bundle to: the count of the
// objects the record reaches (held ones too), and the room the store's
// filesystem has past its minimum free space. Refused, it leaves B as it
// was.
func TestFetchCountAndRoom(t *testing.T) {
	a := mustStore(t)
	rec := imageRun(t, a, "r1", map[string][]byte{"big": bytes.Repeat([]byte("b"), 1<<20)}, map[string][]byte{"m": []byte("m")})
	objs := reached(t, a, rec)
	srv := serve(t, a, nil)
	for name, c := range map[string]struct {
		opt  transfer.Options
		want error
	}{
		"count": {transfer.Options{Limits: bundle.Limits{Objects: len(objs) - 1}}, transfer.ErrLimit},
		"room":  {transfer.Options{Free: func() (uint64, error) { return 1 << 20, nil }}, transfer.ErrNoSpace},
	} {
		t.Run(name, func(t *testing.T) {
			b := mustStore(t)
			_, err := transfer.Fetch(context.Background(), transfer.Source{Client: http.DefaultClient, Base: srv.URL}, b, rec, c.opt)
			if !errors.Is(err, c.want) || !errors.Is(err, bundle.ErrLimit) && !errors.Is(err, park.ErrNoSpace) {
				t.Fatalf("fetch: %v, want %v", err, c.want)
			}
			if n := stored(t, b); n != 0 {
				t.Fatalf("B holds %d objects after a refused fetch", n)
			}
		})
	}
	b := mustStore(t)
	opt := transfer.Options{Limits: bundle.Limits{Objects: len(objs)}, Free: func() (uint64, error) { return 2 << 20, nil }}
	if _, err := transfer.Fetch(context.Background(), transfer.Source{Client: http.DefaultClient, Base: srv.URL}, b, rec, opt); err != nil {
		t.Fatalf("within the count and the room: %v", err)
	}
	if n := stored(t, b); n != len(objs) {
		t.Fatalf("B holds %d objects, want the %d reached", n, len(objs))
	}
}

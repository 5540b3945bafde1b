package daemon

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/etcdtest"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/fleet/member"
	"github.com/runrecordd/runrecordd/internal/fleet/transfer"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// stalledSource is a fleet whose post-copy source never answers: Source
// returns only when its context ends, and says so on called.
type stalledSource struct {
	member.Peers // nothing else is called
	called       chan struct{}
}

func (p *stalledSource) Source(ctx context.Context, _ record.Address) (transfer.Source, func(), error) {
	select {
	case p.called <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return transfer.Source{}, nil, ctx.Err()
}

// storeOwing stores in st run id, parked once, its memory image a pages
// file in the slab form whose one slab the run owes source, as a
// post-copy migration's target does (the slab is stored: the fetch of it
// asks the source first all the same).
func storeOwing(t *testing.T, st *store.Store, id string, source record.Address) *record.Record {
	t.Helper()
	put := func(b []byte, refs ...record.Address) record.Address {
		a, err := st.PutBytes(b, refs...)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	ingest := func(files map[string][]byte) record.Address {
		dir, err := st.StagingDir("test")
		if err != nil {
			t.Fatal(err)
		}
		for name, b := range files {
			p := filepath.Join(dir, name)
			if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		a, _, err := st.Ingest(t.Context(), dir)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	chunk := bytes.Repeat([]byte{'a'}, 16<<10)
	slab := record.Sum(chunk)
	idx := store.EncodeSlabIndex([]store.SlabChunk{{Vaddr: 0x10000, Size: 16 << 10, Slab: 0, Offset: 0, Address: slab}})
	root := ingest(map[string][]byte{"rootfs/etc/x": []byte("x")})
	memory := ingest(map[string][]byte{"core-1.img": []byte("core"), "pages-1.img.slabs/index": idx, "pages-1.img.slabs/00": chunk})
	sp := unit.Spec{Image: "example/unit:2", ImageDigest: "sha256:" + strings.Repeat("b", 64), Mode: unit.ImageMode, Args: []string{id}}
	sc, err := sp.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	rc, _ := (&attest.Receipt{Provenance: record.Estimated, Method: "test", WindowNS: 1}).Canonical()
	var j attest.Journal
	rca, ja := put(rc), put(j.Encode())
	man := manifest.Manifest{}
	for _, k := range manifest.ImageKeys {
		man[k] = "x"
	}
	mc, _ := man.Canonical()
	g := unit.Grants{Network: unit.NoNetwork}
	rec := record.New(put(sc), put(g.Encode()))
	susp := record.Suspension(record.ImageSnapshot(root, &memory), put(mc))
	c, _ := susp.Canonical()
	key := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{7}, 32))
	sig, err := attest.Sign(&attest.Body{Genesis: rec.Genesis(), Interval: 1, PrevHead: rec.Head(), StartNS: 1, EndNS: 2,
		Receipt: rca, Journal: ja, Outcome: attest.Outcome{Kind: attest.Parked, Suspends: record.Sum(c)}}, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, seg := range []record.Segment{record.Execution(put(sig.Encode(), rca, ja), nil), susp} {
		if _, err := rec.Append(seg); err != nil {
			t.Fatal(err)
		}
	}
	o := store.Owing{Source: source, Head: rec.Head(), Slabs: []record.Address{slab}, Listings: []record.Address{memory}}
	if err := st.ImportOwing(id, rec, false, o); err != nil {
		t.Fatal(err)
	}
	return rec
}

// A stop ends the post-copy fetches before it takes the runs' locks: a
// resume waiting on the fetch of its run's slabs (holding the run's lock)
// is refused, and the daemon's shutdown ends, though the source never
// answers and the resume's request has no deadline. Seen failing first:
// the shutdown waited for the run's lock, which the resume held until
// the fetch ended, which only the shutdown's later fleet.Close ended.
func TestShutdownEndsPostCopyFetchFirst(t *testing.T) {
	c := etcdtest.Shared(t)
	dir := fleet.New(c.Client(t), "/daemon-postcopy-stop/", 5*time.Second)
	a := joinFleet(t, dir, "a")
	h := newFakeHost(t)
	src := &stalledSource{called: make(chan struct{}, 1)}
	h.d.cfg.Join.Peers = src
	inFleet(h.d, a, nil)
	rec := storeOwing(t, h.d.st, "owing", record.Sum([]byte("source")))
	if _, err := a.Claim(t.Context(), rec.Genesis(), "owing", rec.Head(), record.PhaseParked); err != nil {
		t.Fatal(err)
	}
	resumed := make(chan error, 1)
	go func() {
		_, err := h.d.Resume(context.Background(), "owing", nil)
		resumed <- err
	}()
	select {
	case <-src.called:
	case <-time.After(30 * time.Second):
		t.Fatal("the resume never asked the source for the run's slabs")
	}
	stopped := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		stopped <- h.d.Shutdown(ctx)
	}()
	select {
	case <-stopped:
	case <-time.After(10 * time.Second):
		t.Fatal("the shutdown waits on the run's lock, held by a resume waiting on a stalled post-copy fetch")
	}
	select {
	case err := <-resumed:
		if err == nil {
			t.Fatal("a run owing its slabs resumed")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the resume still waits")
	}
}

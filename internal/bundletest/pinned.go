package bundletest

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"strings"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Pinned fills an empty store with the runs whose bundles are pinned in
// internal/bundle/testdata/export (in format 1 by the daemon's exporter
// before it moved to internal/bundle, *.1.bundle; in format 2 by
// internal/bundle's): "t", a forged transcript run of one interval, and
// "i", an image run of two intervals whose snapshots share files and whose
// attestations share a journal (its objects are not what a host writes: an
// export does not read them). Changing what it stores changes the pinned
// bundles.
func Pinned(ctx context.Context, st *store.Store) error {
	key := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{1}, 32))
	r := Run{Spec: unit.Spec{Image: "example/unit:1", ImageDigest: "sha256:" + strings.Repeat("a", 64), Mode: unit.TranscriptMode, Args: []string{"a"}},
		Grants: unit.Grants{Network: unit.NoNetwork}, Key: key, Transcript: []byte("{\"t\":1}\n"),
		Calls: []protocol.Call{{ID: "c1", Kind: "http", Payload: []byte(`{}`)}}}
	b, err := r.Forge("t")
	if err != nil {
		return err
	}
	sb, err := bundle.Stage(ctx, st, bytes.NewReader(b.Tar(nil)), bundle.Options{})
	if err != nil {
		return err
	}
	defer sb.Close()
	if err := sb.Adopt(ctx, st); err != nil {
		return err
	}
	if err := st.ImportAs("t", sb.Record, false); err != nil {
		return err
	}
	return pinnedImage(st)
}

// pinnedImage stores Pinned's run "i".
func pinnedImage(st *store.Store) (err error) {
	put := func(s string, refs ...record.Address) record.Address {
		a, perr := st.PutBytes([]byte(s), refs...)
		if err == nil {
			err = perr
		}
		return a
	}
	listing := func(files ...string) record.Address {
		var es []store.Entry
		var refs []record.Address
		for _, f := range files {
			a := put("bytes of " + f)
			es = append(es, store.Entry{Name: f, Mode: 0o600, Size: uint64(len("bytes of " + f)), Address: a})
			refs = append(refs, a)
		}
		lb, lerr := store.EncodeListing(es)
		if err == nil {
			err = lerr
		}
		return put(string(lb), refs...)
	}
	u, g := put("unit i"), put("grants i")
	if err != nil {
		return err
	}
	head, err := st.Create("i", u, g)
	if err != nil {
		return err
	}
	journal := put("journal")
	mem1, mem2 := listing("core-1.img", "pages-1.img"), listing("core-1.img", "pages-2.img")
	snap1 := record.ImageSnapshot(listing("etc/hosts", "bin/unit"), &mem1)
	snap2 := record.ImageSnapshot(listing("etc/hosts", "bin/unit", "tmp/out"), &mem2)
	segs := []record.Segment{
		record.Execution(put("attestation 1", put("receipt 1"), journal), nil),
		record.Suspension(snap1, put("manifest 1")),
		record.Resumption(snap1, 7, record.Estimated),
		record.Execution(put("attestation 2", put("receipt 2"), journal), &record.CallAccount{Dispatched: []string{"x"}}),
		record.Suspension(snap2, put("manifest 2")),
	}
	if err != nil {
		return err
	}
	_, err = st.AppendAll("i", head, segs...)
	return err
}

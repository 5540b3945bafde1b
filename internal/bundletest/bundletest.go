// Package bundletest forges bundles (docs/bundle.md) for tests: a parked
// transcript run of one interval signed by a key of the test's ([Run.Forge]),
// one interval on ([Bundle.Extend]), written as a tar by hand so that a test
// can add what no honest exporter writes — sparse members, members the
// record does not reach, sizes that lie. [Pinned] fills a store with the
// runs whose exported bundles internal/bundle pins.
package bundletest

import (
	"bytes"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"lukechampine.com/blake3"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/protocol"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Run is a parked transcript run to forge.
type Run struct {
	Spec       unit.Spec
	Grants     unit.Grants
	Key        ed25519.PrivateKey
	Transcript []byte
	// Calls were dispatched in the interval and are outstanding at the
	// park: the calls GET /v1/calls lists for the run.
	Calls []protocol.Call
	// Manifest is the park's manifest; nil names every transcript key
	// with this host's-looking values (Arch amd64).
	Manifest manifest.Manifest
	// Legacy signs the interval as the daemon did before a park's
	// attestation named its Suspended segment: outcome killed.
	Legacy bool
}

// Object is one object of a bundle.
type Object struct {
	Addr  record.Address
	Bytes []byte
}

// Bundle is a forged bundle: its run id, record and objects in order.
type Bundle struct {
	Run     string
	Record  *record.Record
	Objects []Object
}

// Add appends an object and returns its address.
func (b *Bundle) Add(p []byte) record.Address {
	a := record.Sum(p)
	for _, o := range b.Objects {
		if o.Addr == a {
			return a
		}
	}
	b.Objects = append(b.Objects, Object{a, p})
	return a
}

// Object returns the bytes of the object at a, or nil.
func (b *Bundle) Object(a record.Address) []byte {
	for _, o := range b.Objects {
		if o.Addr == a {
			return o.Bytes
		}
	}
	return nil
}

// Drop removes the object at a.
func (b *Bundle) Drop(a record.Address) {
	for i, o := range b.Objects {
		if o.Addr == a {
			b.Objects = append(b.Objects[:i], b.Objects[i+1:]...)
			return
		}
	}
}

// Forge builds the bundle of run id: unit spec, grant set, receipt,
// journal, attestation (signed by r.Key at its place), transcript and
// manifest, and the record genesis → Executed → Suspended.
func (r Run) Forge(id string) (*Bundle, error) {
	b := &Bundle{Run: id}
	sc, err := r.Spec.Canonical()
	if err != nil {
		return nil, err
	}
	// Unvalidated: a forged bundle may carry grants no host grants.
	gc := r.Grants.Encode()
	ua, ga := b.Add(sc), b.Add(gc)
	rc, err := (&attest.Receipt{Provenance: record.Estimated, Method: "forged", WindowNS: 1}).Canonical()
	if err != nil {
		return nil, err
	}
	rca := b.Add(rc)
	var j attest.Journal
	var ids []string
	for _, c := range r.Calls {
		p, _ := json.Marshal(c)
		j.Add(attest.Dispatch, 2, p)
		ids = append(ids, c.ID)
	}
	ja := b.Add(j.Encode())
	ta := b.Add(r.Transcript)
	m := r.Manifest
	if m == nil {
		m = manifest.Manifest{manifest.Arch: "amd64", manifest.ImageDigest: r.Spec.ImageDigest, manifest.Protocol: protocol.Version}
	}
	mc, err := m.Canonical()
	if err != nil {
		return nil, err
	}
	ma := b.Add(mc)
	rec := record.New(ua, ga)
	susp := record.Suspension(record.TranscriptSnapshot(ta), ma)
	out := attest.Outcome{Kind: attest.Killed}
	if !r.Legacy {
		c, _ := susp.Canonical()
		out = attest.Outcome{Kind: attest.Parked, Suspends: record.Sum(c)}
	}
	body := &attest.Body{Genesis: rec.Genesis(), Interval: 1, PrevHead: rec.Head(), StartNS: 1, EndNS: 2,
		Receipt: rca, Journal: ja, Outcome: out}
	s, err := attest.Sign(body, r.Key)
	if err != nil {
		return nil, err
	}
	aa := b.Add(s.Encode())
	var calls *record.CallAccount
	if len(ids) > 0 {
		calls = &record.CallAccount{Dispatched: ids}
	}
	for _, seg := range []record.Segment{record.Execution(aa, calls), susp} {
		if _, err := rec.Append(seg); err != nil {
			return nil, err
		}
	}
	b.Record = rec
	return b, nil
}

// Extend returns a bundle of b's parked run one interval on, as the host
// that resumed it would export it: b's objects, and its record followed
// by Resumed (from the park), Executed (an interval signed by key at its
// place, its outcome the park that follows) and Suspended (transcript,
// under the last park's manifest). b is left as it was.
func (b *Bundle) Extend(key ed25519.PrivateKey, transcript []byte) (*Bundle, error) {
	rec, err := record.DecodeWire(b.Record.EncodeWire())
	if err != nil {
		return nil, err
	}
	if rec.Phase() != record.PhaseParked {
		return nil, fmt.Errorf("bundletest: extend a %s run", rec.Phase())
	}
	out := &Bundle{Run: b.Run, Objects: append([]Object(nil), b.Objects...)}
	park := rec.Segment(rec.Len() - 1)
	var interval uint64
	for i := range rec.Len() {
		if rec.Segment(i).Kind == record.Executed {
			interval++
		}
	}
	if _, err := rec.Append(record.Resumption(park.Snapshot, 1, record.Estimated)); err != nil {
		return nil, err
	}
	rc, err := (&attest.Receipt{Provenance: record.Estimated, Method: "forged", WindowNS: 1}).Canonical()
	if err != nil {
		return nil, err
	}
	var j attest.Journal
	susp := record.Suspension(record.TranscriptSnapshot(out.Add(transcript)), park.Manifest)
	c, _ := susp.Canonical()
	body := &attest.Body{Genesis: rec.Genesis(), Interval: interval + 1, PrevHead: rec.Head(), StartNS: 3, EndNS: 4,
		Receipt: out.Add(rc), Journal: out.Add(j.Encode()), Outcome: attest.Outcome{Kind: attest.Parked, Suspends: record.Sum(c)}}
	sig, err := attest.Sign(body, key)
	if err != nil {
		return nil, err
	}
	for _, seg := range []record.Segment{record.Execution(out.Add(sig.Encode()), nil), susp} {
		if _, err := rec.Append(seg); err != nil {
			return nil, err
		}
	}
	out.Record = rec
	return out, nil
}

// Tar writes the bundle in format 1 (bundle.Format1: every object a
// member; internal/bundle reads it as it reads format 2, and its pack
// tests write format 2 themselves): bundle.json (declaring its objects, then changed
// by adjust when not nil), record.json, every object, then extra (raw tar
// blocks, from [Member] or [Sparse]), then the tar's end.
func (b *Bundle) Tar(adjust func(*bundle.Header), extra ...[]byte) []byte {
	h := bundle.Header{Format: bundle.Format1, Run: b.Run, Objects: len(b.Objects)}
	for _, o := range b.Objects {
		h.Bytes += int64(len(o.Bytes))
	}
	if adjust != nil {
		adjust(&h)
	}
	hb, _ := json.Marshal(h)
	var out bytes.Buffer
	out.Write(Member("bundle.json", hb))
	out.Write(Member("record.json", b.Record.EncodeWire()))
	for _, o := range b.Objects {
		out.Write(Member(Name(o.Addr), o.Bytes))
	}
	for _, e := range extra {
		out.Write(e)
	}
	out.Write(make([]byte, 1024))
	return out.Bytes()
}

// Name is an object's member name.
func Name(a record.Address) string {
	return "objects/" + strings.TrimPrefix(a.String(), record.AddressPrefix)
}

// Member is a regular-file tar member: its header and its data, padded.
func Member(name string, data []byte) []byte {
	return append(Header(name, int64(len(data)), '0'), pad(data)...)
}

// Header is a 512-byte ustar header.
func Header(name string, size int64, typeflag byte) []byte {
	h := make([]byte, 512)
	copy(h[0:100], name)
	copy(h[100:108], "0000444\x00")
	copy(h[108:116], "0000000\x00")
	copy(h[116:124], "0000000\x00")
	copy(h[124:136], fmt.Sprintf("%011o\x00", size))
	copy(h[136:148], "00000000000\x00")
	h[156] = typeflag
	copy(h[257:265], "ustar\x0000")
	copy(h[148:156], "        ")
	sum := 0
	for _, c := range h {
		sum += int(c)
	}
	copy(h[148:156], fmt.Sprintf("%06o\x00 ", sum))
	return h
}

func pad(data []byte) []byte {
	if n := len(data) % 512; n != 0 {
		return append(append([]byte(nil), data...), make([]byte, 512-n)...)
	}
	return data
}

// PAX is a PAX extended header ('x') carrying records, to precede the
// member it describes.
func PAX(records map[string]string) []byte {
	keys := make([]string, 0, len(records))
	for k := range records {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var body []byte
	for _, k := range keys {
		rec := " " + k + "=" + records[k] + "\n"
		n := len(rec) + len(strconv.Itoa(len(rec)))
		if len(strconv.Itoa(n)) != len(strconv.Itoa(len(rec))) {
			n = len(rec) + len(strconv.Itoa(n))
		}
		body = append(body, fmt.Sprintf("%d%s", n, rec)...)
	}
	return append(Header("PaxHeaders/x", int64(len(body)), 'x'), pad(body)...)
}

// Sparse is a GNU sparse (PAX 1.0) member named name whose content reads
// as size zero bytes, from 1536 bytes of tar: one data byte at the end.
func Sparse(name string, size int64) []byte {
	out := PAX(map[string]string{"GNU.sparse.major": "1", "GNU.sparse.minor": "0",
		"GNU.sparse.name": name, "GNU.sparse.realsize": fmt.Sprint(size)})
	sparseMap := pad([]byte(fmt.Sprintf("1\n%d\n1\n", size-1)))
	out = append(out, Header("GNUSparseFile.0/x", int64(len(sparseMap))+1, '0')...)
	out = append(out, sparseMap...)
	return append(out, pad([]byte{0})...)
}

// Zeros returns the address of n zero bytes.
func Zeros(n int64) record.Address {
	h := blake3.New(32, nil)
	buf := make([]byte, 1<<20)
	for n > 0 {
		k := min(n, int64(len(buf)))
		h.Write(buf[:k])
		n -= k
	}
	var a record.Address
	h.Sum(a[:0])
	return a
}

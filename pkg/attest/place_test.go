package attest

import (
	"crypto/ed25519"
	"errors"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// placed builds a parked record of two intervals, each attested at its
// place by key, and the objects it names.
func placed(t *testing.T, key ed25519.PrivateKey, unit byte, tail record.Segment) (*record.Record, map[record.Address][]byte) {
	t.Helper()
	objs := map[record.Address][]byte{}
	rec := record.New(fill(unit), fill(unit+1))
	attestNext := func(out Outcome) record.Segment {
		n := uint64(0)
		for i := range rec.Len() {
			if rec.Segment(i).Kind == record.Executed {
				n++
			}
		}
		s, err := Sign(&Body{Genesis: rec.Genesis(), Interval: n + 1, PrevHead: rec.Head(), StartNS: 1, EndNS: 2,
			Receipt: fill(7), Journal: fill(8), Outcome: out}, key)
		if err != nil {
			t.Fatal(err)
		}
		b := s.Encode()
		a := record.Sum(b)
		objs[a] = b
		return record.Execution(a, nil)
	}
	susp := func(tr byte) record.Segment {
		return record.Suspension(record.TranscriptSnapshot(fill(tr)), fill(tr+1))
	}
	parked := func(s record.Segment) Outcome {
		c, _ := s.Canonical()
		return Outcome{Kind: Parked, Suspends: record.Sum(c)}
	}
	s1 := susp(20)
	for _, s := range []record.Segment{attestNext(parked(s1)), s1, record.Resumption(s1.Snapshot, 1, record.Estimated)} {
		if _, err := rec.Append(s); err != nil {
			t.Fatal(err)
		}
	}
	s2 := susp(30)
	if _, err := rec.Append(attestNext(parked(s2))); err != nil {
		t.Fatal(err)
	}
	if tail.Kind == 0 {
		tail = s2
	}
	if _, err := rec.Append(tail); err != nil {
		t.Fatal(err)
	}
	return rec, objs
}

func TestCheckRecord(t *testing.T) {
	key := ed25519.NewKeyFromSeed(make([]byte, 32))
	id := KeyID(key.Public().(ed25519.PublicKey))
	rec, objs := placed(t, key, 1, record.Segment{})
	read := func(a record.Address) ([]byte, error) { return objs[a], nil }
	signers, err := CheckRecord(rec, read, func(k record.Address) bool { return k == id })
	if err != nil || len(signers) != 2 || signers[1] != (Signer{Index: 3, Interval: 2, Key: id, Trusted: true}) {
		t.Fatalf("%+v %v", signers, err)
	}
	if Untrusted(signers) != nil {
		t.Fatal("trusted signers reported untrusted")
	}
	signers, err = CheckRecord(rec, read, nil)
	var ue *UntrustedError
	if err != nil || !errors.As(Untrusted(signers), &ue) || ue.Key != id || ue.Index != 0 {
		t.Fatalf("no trusted key: %v %v", signers, err)
	}

	// Another run's attestation spliced in: its genesis differs.
	other, oobjs := placed(t, key, 50, record.Segment{})
	spliced := record.New(rec.Unit(), rec.Grants())
	for i := range other.Len() {
		spliced.Append(other.Segment(i))
	}
	_, err = CheckRecord(spliced, func(a record.Address) ([]byte, error) { return oobjs[a], nil }, nil)
	var pe *PlaceError
	if !errors.As(err, &pe) || pe.Field != "genesis" || pe.Index != 0 || !errors.Is(err, ErrPlace) {
		t.Fatalf("spliced genesis: %v", err)
	}
	// Intervals swapped (the second attestation first): ordinal and head.
	swapped := record.New(rec.Unit(), rec.Grants())
	swapped.Append(rec.Segment(3))
	if _, err := CheckRecord(swapped, read, nil); !errors.As(err, &pe) || pe.Field != "interval" {
		t.Fatalf("second interval first: %v", err)
	}
	// The tail replaced: another snapshot after the last park.
	tailed, tobjs := placed(t, key, 1, record.Suspension(record.TranscriptSnapshot(fill(40)), fill(41)))
	if _, err := CheckRecord(tailed, func(a record.Address) ([]byte, error) { return tobjs[a], nil }, nil); !errors.As(err, &pe) || pe.Field != "suspended segment" || pe.Index != 3 {
		t.Fatalf("replaced tail: %v", err)
	}
	// A Suspended segment no park seals: the interval before it says it
	// was still running.
	bare := record.New(rec.Unit(), rec.Grants())
	running, err := Sign(&Body{Genesis: bare.Genesis(), Interval: 1, PrevHead: bare.Head(), StartNS: 1, EndNS: 2,
		Receipt: fill(7), Journal: fill(8), Outcome: Outcome{Kind: Running}}, key)
	if err != nil {
		t.Fatal(err)
	}
	rb := running.Encode()
	for _, s := range []record.Segment{record.Execution(record.Sum(rb), nil), record.Suspension(record.TranscriptSnapshot(fill(40)), fill(41))} {
		if _, err := bare.Append(s); err != nil {
			t.Fatal(err)
		}
	}
	readBare := func(a record.Address) ([]byte, error) {
		if a == record.Sum(rb) {
			return rb, nil
		}
		return read(a)
	}
	if _, err := CheckRecord(bare, readBare, nil); !errors.As(err, &pe) || pe.Index != 1 {
		t.Fatalf("unsealed suspension: %v", err)
	}
}

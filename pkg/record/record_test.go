package record

import (
	"bytes"
	"errors"
	"math"
	"reflect"
	"testing"
)

func img(root, mem byte) Snapshot { return ImageSnapshot(fill(root), ptr(fill(mem))) }

func TestLifecycle(t *testing.T) {
	r := mustRecord(t)
	heads := map[Address]bool{r.Head(): true}
	for _, s := range []Segment{
		Execution(fill(0x10), nil),
		Suspension(img(0x20, 0x21), fill(0x30)),
		Resumption(img(0x20, 0x21), 500, Estimated),
		Execution(fill(0x11), &CallAccount{}),
		Suspension(TranscriptSnapshot(fill(0x22)), fill(0x31)),
		Resumption(TranscriptSnapshot(fill(0x22)), 7, Measured),
		Closure("finished"),
	} {
		h := mustAppend(t, r, s)
		if heads[h] {
			t.Fatalf("head %s repeated", h)
		}
		heads[h] = true
	}
	if r.Phase() != PhaseClosed || r.Len() != 7 {
		t.Fatalf("phase %s len %d", r.Phase(), r.Len())
	}
	tot, err := r.Totals(func(a Address) (uint64, bool) { return uint64(a[0]), true })
	if err != nil {
		t.Fatal(err)
	}
	if tot.ActiveUJ != 0x10+0x11 || tot.IdleUJ != 507 || tot.CostUJ != 0x21+507 || tot.IdleMeasured {
		t.Fatalf("totals %+v", tot)
	}
}

// refuse appends s, expects err and checks the record is untouched.
func refuse(t *testing.T, r *Record, s Segment, want error) {
	t.Helper()
	before, st := r.EncodeWire(), r.State()
	_, err := r.Append(s)
	if !errors.Is(err, want) {
		t.Fatalf("append %s: err = %v, want %v", s.Kind, err, want)
	}
	var se *SegmentError
	if !errors.As(err, &se) || se.Index != r.Len() {
		t.Fatalf("error %v does not name segment %d", err, r.Len())
	}
	if !bytes.Equal(before, r.EncodeWire()) || !reflect.DeepEqual(st, r.State()) {
		t.Fatal("a refused append changed the record")
	}
}

func TestPhaseRules(t *testing.T) {
	r := mustRecord(t)
	refuse(t, r, Resumption(img(1, 2), 1, Estimated), ErrNotParked)
	mustAppend(t, r, Execution(fill(1), nil))
	mustAppend(t, r, Suspension(img(1, 2), fill(3)))
	refuse(t, r, Execution(fill(1), nil), ErrParked)
	refuse(t, r, Suspension(img(1, 2), fill(3)), ErrParked)
	refuse(t, r, Resumption(img(1, 9), 1, Estimated), ErrSnapshotMismatch)
	refuse(t, r, Resumption(ImageSnapshot(fill(1), nil), 1, Estimated), ErrSnapshotMismatch)
	refuse(t, r, Resumption(Snapshot{Root: ptr(fill(1)), Transcript: ptr(fill(2))}, 1, Estimated), ErrMalformedSnapshot)
	mustAppend(t, r, Resumption(img(1, 2), 1, Estimated))
	refuse(t, r, Resumption(img(1, 2), 1, Estimated), ErrNotParked)
	mustAppend(t, r, Closure("done"))
	refuse(t, r, Execution(fill(1), nil), ErrClosed)
	refuse(t, r, Closure("again"), ErrClosed)
}

func TestCloseWhileParked(t *testing.T) {
	r := mustRecord(t)
	mustAppend(t, r, Execution(fill(1), nil))
	mustAppend(t, r, Suspension(TranscriptSnapshot(fill(4)), fill(3)))
	mustAppend(t, r, Closure("abandoned"))
	refuse(t, r, Resumption(TranscriptSnapshot(fill(4)), 1, Estimated), ErrClosed)
}

func TestImageAndTranscriptOverSameAddressDiffer(t *testing.T) {
	inner := fill(0x42)
	r := mustRecord(t)
	mustAppend(t, r, Execution(fill(1), nil))
	mustAppend(t, r, Suspension(ImageSnapshot(inner, nil), fill(3)))
	refuse(t, r, Resumption(TranscriptSnapshot(inner), 1, Estimated), ErrSnapshotMismatch)
	r2 := mustRecord(t)
	mustAppend(t, r2, Execution(fill(1), nil))
	mustAppend(t, r2, Suspension(TranscriptSnapshot(inner), fill(3)))
	refuse(t, r2, Resumption(ImageSnapshot(inner, nil), 1, Estimated), ErrSnapshotMismatch)
}

// A park ends an interval: a Suspended segment follows an Executed one,
// never genesis, a Resumed or another Suspended.
func TestStrictAlternation(t *testing.T) {
	r := mustRecord(t)
	refuse(t, r, Suspension(img(1, 2), fill(3)), ErrAlternation)
	mustAppend(t, r, Execution(fill(1), nil))
	mustAppend(t, r, Execution(fill(2), nil)) // intervals may follow one another
	mustAppend(t, r, Suspension(img(1, 2), fill(3)))
	mustAppend(t, r, Resumption(img(1, 2), 1, Estimated))
	refuse(t, r, Suspension(img(1, 2), fill(3)), ErrAlternation)
	mustAppend(t, r, Closure("resumed, then closed"))
	// The state carries what the rule needs, so a chain continued from a
	// stored state judges the same way.
	st := r.State()
	if st.Last != Closed {
		t.Fatalf("state's last kind %s, want closed", st.Last)
	}
	c := NewChain(State{Head: r.Genesis(), Len: 3, Phase: PhaseExecuting, Last: Resumed})
	if err := c.Check(&Segment{Kind: Suspended, Snapshot: img(1, 2), Manifest: fill(3)}); !errors.Is(err, ErrAlternation) {
		t.Fatalf("chain after a resumed segment: %v", err)
	}
}

func TestIdleTotalOverflowRefused(t *testing.T) {
	r := mustRecord(t)
	park := func(idle uint64, want error) {
		t.Helper()
		mustAppend(t, r, Execution(fill(1), nil))
		mustAppend(t, r, Suspension(TranscriptSnapshot(fill(4)), fill(3)))
		if want != nil {
			refuse(t, r, Resumption(TranscriptSnapshot(fill(4)), idle, Estimated), want)
			return
		}
		mustAppend(t, r, Resumption(TranscriptSnapshot(fill(4)), idle, Estimated))
	}
	park(math.MaxUint64-10, nil)
	park(10, nil) // exactly 2⁶⁴−1 in all
	if st := r.State(); st.IdleUJ != math.MaxUint64 {
		t.Fatalf("idle total %d", st.IdleUJ)
	}
	park(1, ErrOverflow)
	if _, err := r.Totals(func(Address) (uint64, bool) { return 0, true }); err != nil {
		t.Fatalf("a record at the idle limit: %v", err)
	}
}

func TestDuplicateCallIDInOneListRefused(t *testing.T) {
	r := mustRecord(t)
	refuse(t, r, Execution(fill(1), &CallAccount{Dispatched: []string{"a", "b", "a"}}), ErrMalformedSegment)
	long := make([]string, 40)
	for i := range long {
		long[i] = string(rune('a'+i%26)) + string(rune('a'+i/26))
	}
	long[39] = long[3]
	refuse(t, r, Execution(fill(1), &CallAccount{Resolved: long}), ErrMalformedSegment)
	// The same id in both lists, or in two segments, is the wait proof's.
	mustAppend(t, r, Execution(fill(1), &CallAccount{Dispatched: []string{"a"}}))
	mustAppend(t, r, Execution(fill(2), &CallAccount{Dispatched: []string{"a"}}))
	if v := r.WaitProof(); v.Kind != Malformed || v.Segment != 1 {
		t.Fatalf("verdict %v", v)
	}
	r2 := mustRecord(t)
	mustAppend(t, r2, Execution(fill(1), &CallAccount{Dispatched: []string{"a"}, Resolved: []string{"a"}}))
	if v := r2.WaitProof(); v.Kind != Blocked || v.Segment != 0 {
		t.Fatalf("verdict %v", v)
	}
}

// The zero address names no object, wherever a segment states one.
func TestZeroAddressRefusedEverywhere(t *testing.T) {
	var zero Address
	r := mustRecord(t)
	refuse(t, r, Execution(zero, nil), ErrMalformedSegment)
	mustAppend(t, r, Execution(fill(1), nil))
	refuse(t, r, Suspension(img(1, 2), zero), ErrMalformedSegment)
	refuse(t, r, Suspension(ImageSnapshot(zero, nil), fill(3)), ErrMalformedSnapshot)
	refuse(t, r, Suspension(ImageSnapshot(fill(1), &zero), fill(3)), ErrMalformedSnapshot)
	refuse(t, r, Suspension(TranscriptSnapshot(zero), fill(3)), ErrMalformedSnapshot)
	mustAppend(t, r, Suspension(ImageSnapshot(fill(1), nil), fill(3)))
	if err := Verify(zero, fill(2), nil, nil); !errors.Is(err, ErrAddress) {
		t.Fatalf("zero unit id: %v", err)
	}
	if err := Verify(fill(1), zero, nil, nil); !errors.Is(err, ErrAddress) {
		t.Fatalf("zero grants id: %v", err)
	}
}

func TestAppendCopiesCallerData(t *testing.T) {
	r := mustRecord(t)
	acct := &CallAccount{Dispatched: []string{"a"}}
	root := fill(1)
	mustAppend(t, r, Execution(fill(1), acct))
	mustAppend(t, r, Suspension(Snapshot{Root: &root}, fill(2)))
	acct.Dispatched[0] = "changed"
	root[0] = 0xff
	if err := r.Verify(); err != nil {
		t.Fatal(err)
	}
	mustAppend(t, r, Resumption(ImageSnapshot(fill(1), nil), 1, Estimated))
}

func TestVerifyNamesEditedSegment(t *testing.T) {
	r := mustRecord(t)
	mustAppend(t, r, Execution(fill(1), nil))
	mustAppend(t, r, Suspension(img(1, 2), fill(3)))
	mustAppend(t, r, Resumption(img(1, 2), 1, Estimated))
	segs := make([]Segment, r.Len())
	heads := make([]Address, r.Len())
	for i := range segs {
		segs[i], heads[i] = r.Segment(i), r.HeadAt(i)
	}
	segs[2].IdleUJ = 2 // edited after the fact
	err := Verify(r.Unit(), r.Grants(), segs, heads)
	var se *SegmentError
	if !errors.Is(err, ErrHeadMismatch) || !errors.As(err, &se) || se.Index != 2 {
		t.Fatalf("err = %v, want head mismatch at segment 2", err)
	}
	if err := Verify(fill(9), r.Grants(), segs[:1], heads[:1]); !errors.Is(err, ErrHeadMismatch) {
		t.Fatalf("another unit's genesis verified: %v", err)
	}
}

func TestTotalsErrors(t *testing.T) {
	r := mustRecord(t)
	mustAppend(t, r, Execution(fill(1), nil))
	if _, err := r.Totals(func(Address) (uint64, bool) { return 0, false }); !errors.Is(err, ErrReceipt) {
		t.Fatalf("missing receipt: %v", err)
	}
	mustAppend(t, r, Execution(fill(2), nil))
	if _, err := r.Totals(func(Address) (uint64, bool) { return 1 << 63, true }); !errors.Is(err, ErrReceipt) {
		t.Fatalf("overflow: %v", err)
	}
}

// Records longer than one storage chunk keep every segment and head.
func TestLongRecordAcrossChunks(t *testing.T) {
	r := mustRecord(t)
	var heads []Address
	for i := range 3*chunkLen + 5 {
		var att Address
		att[0], att[1], att[2] = 1, byte(i), byte(i>>8)
		heads = append(heads, mustAppend(t, r, Execution(att, &CallAccount{})))
	}
	for i, h := range heads {
		if r.HeadAt(i) != h || r.Segment(i).Attestation[1] != byte(i) {
			t.Fatalf("segment %d lost", i)
		}
	}
	if v := r.WaitProof(); v.Kind != NonBlocking {
		t.Fatal(v)
	}
}

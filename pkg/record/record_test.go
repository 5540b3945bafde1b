package record

import (
	"bytes"
	"errors"
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
	if r.Phase() != Ended || r.Len() != 7 {
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
	mustAppend(t, r, Suspension(TranscriptSnapshot(fill(4)), fill(3)))
	mustAppend(t, r, Closure("abandoned"))
	refuse(t, r, Resumption(TranscriptSnapshot(fill(4)), 1, Estimated), ErrClosed)
}

func TestImageAndTranscriptOverSameAddressDiffer(t *testing.T) {
	inner := fill(0x42)
	r := mustRecord(t)
	mustAppend(t, r, Suspension(ImageSnapshot(inner, nil), fill(3)))
	refuse(t, r, Resumption(TranscriptSnapshot(inner), 1, Estimated), ErrSnapshotMismatch)
	r2 := mustRecord(t)
	mustAppend(t, r2, Suspension(TranscriptSnapshot(inner), fill(3)))
	refuse(t, r2, Resumption(ImageSnapshot(inner, nil), 1, Estimated), ErrSnapshotMismatch)
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

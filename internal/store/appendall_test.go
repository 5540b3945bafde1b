package store

import (
	"bytes"
	"errors"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/record"
)

func TestAppendAll(t *testing.T) {
	s := mustStore(t)
	g := mustCreate(t, s, "r")
	u, gr := unitOf("r")
	att, tr, man := put(t, s, "att"), put(t, s, "transcript"), put(t, s, "manifest")
	park := []record.Segment{record.Execution(att, nil), record.Suspension(record.TranscriptSnapshot(tr), man)}
	h, err := s.AppendAll("r", g, park...)
	if err != nil {
		t.Fatal(err)
	}
	want := record.New(u, gr)
	for _, seg := range park {
		if _, err := want.Append(seg); err != nil {
			t.Fatal(err)
		}
	}
	if h != want.Head() {
		t.Fatalf("head %s, want %s", h, want.Head())
	}
	run, err := s.Run("r")
	if err != nil || run.Head != h || run.Len != 2 || run.Phase != record.PhaseParked || !run.Parked.Equal(park[1].Snapshot) {
		t.Fatalf("run %+v %v", run, err)
	}
	if ids, _ := s.Runs(record.PhaseParked); len(ids) != 1 || ids[0] != "r" {
		t.Fatalf("phase index: %v", ids)
	}
	r, err := s.Record("r")
	if err != nil || r.HeadAt(0) != want.HeadAt(0) || r.Head() != h {
		t.Fatalf("record: %v", err)
	}
	// No segments: nothing written, the head if it is the expected one.
	if got, err := s.AppendAll("r", h); err != nil || got != h {
		t.Fatalf("no segments: %s %v", got, err)
	}
	if _, err := s.AppendAll("r", g); !errors.Is(err, ErrHeadMoved) {
		t.Fatalf("no segments, stale head: %v", err)
	}
	// The record survives a reopen.
	s = mustReopen(t, s)
	if r, err := s.Record("r"); err != nil || r.Head() != h || r.Len() != 2 {
		t.Fatalf("after reopen: %v", err)
	}
}

// A refusal of any segment writes none of them.
func TestAppendAllRefusalWritesNothing(t *testing.T) {
	s := mustStore(t)
	g := mustCreate(t, s, "r")
	att, tr, man := put(t, s, "att"), put(t, s, "transcript"), put(t, s, "manifest")
	h := mustAppend(t, s, "r", g, record.Execution(att, nil))
	before, err := s.Run("r")
	if err != nil {
		t.Fatal(err)
	}
	logLen := func() int {
		n, err := s.logLen()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	entries := logLen()
	susp := record.Suspension(record.TranscriptSnapshot(tr), man)
	for _, tc := range []struct {
		name  string
		head  record.Address
		segs  []record.Segment
		want  error
		index int // of the refused segment, for a *record.SegmentError
	}{
		{"second executes while parked", h, []record.Segment{susp, record.Execution(att, nil)}, record.ErrParked, 2},
		{"second resumes another snapshot", h, []record.Segment{susp, record.Resumption(record.TranscriptSnapshot(att), 1, record.Estimated)}, record.ErrSnapshotMismatch, 2},
		{"third after close", h, []record.Segment{record.Execution(att, nil), record.Closure("done"), record.Execution(att, nil)}, record.ErrClosed, 3},
		{"second names a missing object", h, []record.Segment{record.Execution(att, nil), record.Suspension(record.TranscriptSnapshot(record.Sum([]byte("absent"))), man)}, ErrMissingObject, -1},
		{"stale head", g, []record.Segment{record.Execution(att, nil), susp}, ErrHeadMoved, -1},
	} {
		_, err := s.AppendAll("r", tc.head, tc.segs...)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		var se *record.SegmentError
		if tc.index >= 0 && (!errors.As(err, &se) || se.Index != tc.index) {
			t.Errorf("%s: %v does not name segment %d", tc.name, err, tc.index)
		}
		after, err := s.Run("r")
		if err != nil || !equalRun(after, before) {
			t.Fatalf("%s: run changed: %+v, was %+v (%v)", tc.name, after, before, err)
		}
		if n := logLen(); n != entries {
			t.Fatalf("%s: the log holds %d entries, was %d", tc.name, n, entries)
		}
		if ids, _ := s.Runs(record.PhaseExecuting); len(ids) != 1 {
			t.Fatalf("%s: phase index %v", tc.name, ids)
		}
	}
	r, err := s.Record("r")
	if err != nil || r.Len() != 1 || r.Head() != h || r.Phase() != record.PhaseExecuting {
		t.Fatalf("record after refusals: %v", err)
	}
	// And the run goes on from where it was.
	if _, err := s.AppendAll("r", h, record.Execution(att, nil), susp); err != nil {
		t.Fatal(err)
	}
}

func TestRaw(t *testing.T) {
	s := mustStore(t)
	g := mustCreate(t, s, "r")
	u, gr := unitOf("r")
	att1, att2, tr, man := put(t, s, "att 1"), put(t, s, "att 2"), put(t, s, "transcript"), put(t, s, "manifest")
	h, err := s.AppendAll("r", g, record.Execution(att1, nil), record.Execution(att2, nil), record.Suspension(record.TranscriptSnapshot(tr), man))
	if err != nil {
		t.Fatal(err)
	}
	r, err := s.Record("r")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := s.Raw("r")
	if err != nil || raw.Unit != u || raw.Grants != gr || raw.Head != h || len(raw.Segments) != 3 || len(raw.Heads) != 3 {
		t.Fatalf("raw %+v %v", raw, err)
	}
	for i := range 3 {
		if raw.Heads[i] != r.HeadAt(i) {
			t.Fatalf("head %d: %s, record has %s", i, raw.Heads[i], r.HeadAt(i))
		}
	}
	if err := record.Verify(raw.Unit, raw.Grants, raw.Segments, raw.Heads); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Raw("nope"); !errors.Is(err, ErrNoRun) {
		t.Fatalf("no run: %v", err)
	}

	// Edit segment 1's attestation address: the bytes still decode, so
	// Raw returns them, and verifying them names segment 1.
	restore := editSegment(t, s, "r", 1, func(v []byte) []byte {
		i := bytes.Index(v[32:], att2[:])
		if i < 0 {
			t.Fatal("attestation not in the segment's bytes")
		}
		v[32+i] ^= 1
		return v
	})
	if _, err := s.Record("r"); err == nil {
		t.Fatal("Record read an edited segment")
	}
	raw, err = s.Raw("r")
	if err != nil || len(raw.Segments) != 3 || raw.Segments[1].Attestation == att2 {
		t.Fatalf("raw over an edited segment: %+v %v", raw, err)
	}
	err = record.Verify(raw.Unit, raw.Grants, raw.Segments, raw.Heads)
	var se *record.SegmentError
	if !errors.As(err, &se) || se.Index != 1 || !errors.Is(err, record.ErrHeadMismatch) {
		t.Fatalf("verify over an edited segment: %v", err)
	}
	restore()

	// A segment whose bytes do not decode is an error naming it.
	restore = editSegment(t, s, "r", 2, func(v []byte) []byte { return append(v, 0) })
	_, err = s.Raw("r")
	if !errors.As(err, &se) || se.Index != 2 || !errors.Is(err, ErrDamaged) {
		t.Fatalf("raw over an undecodable segment: %v", err)
	}
	restore()
}

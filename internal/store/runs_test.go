package store

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

func TestCreateAppendRead(t *testing.T) {
	s := mustStore(t)
	g := mustCreate(t, s, "r1")
	u, gr := unitOf("r1")
	if g != record.Genesis(u, gr) {
		t.Fatal("Create did not return head₀")
	}
	att := put(t, s, "attestation 1")
	root, mem, man := put(t, s, "root"), put(t, s, "memory"), put(t, s, "manifest")
	snap := record.ImageSnapshot(root, &mem)
	want := record.New(u, gr)
	h := g
	for i, seg := range []record.Segment{
		record.Execution(att, &record.CallAccount{Dispatched: []string{"c1"}}),
		record.Suspension(snap, man),
		record.Resumption(snap, 99, record.Estimated),
		record.Execution(att, nil),
	} {
		h = mustAppend(t, s, "r1", h, seg)
		wh, _ := want.Append(seg)
		if h != wh {
			t.Fatalf("segment %d: store head %s, pkg/record head %s", i, h, wh)
		}
		if i == 1 { // parked: the summary carries the snapshot
			run, err := s.Run("r1")
			if err != nil || run.Phase != record.PhaseParked || !run.Parked.Equal(snap) {
				t.Fatalf("parked run: %+v %v", run, err)
			}
		}
	}
	run, err := s.Run("r1")
	if err != nil || run.Head != h || run.Len != 4 || run.Phase != record.PhaseExecuting || run.Unit != u || run.Grants != gr {
		t.Fatalf("run %+v %v", run, err)
	}
	if head, err := s.Head("r1"); err != nil || head != h {
		t.Fatalf("head %s %v", head, err)
	}
	r, err := s.Record("r1")
	if err != nil || r.Head() != h || r.Len() != 4 || r.Verify() != nil {
		t.Fatalf("record: %v", err)
	}
	// The record survives a reopen.
	s = mustReopen(t, s)
	if r, err := s.Record("r1"); err != nil || r.Head() != h {
		t.Fatalf("after reopen: %v", err)
	}
}

func TestAppendRefusalsWriteNothing(t *testing.T) {
	s := mustStore(t)
	g := mustCreate(t, s, "r")
	att, tr, man := put(t, s, "att"), put(t, s, "transcript"), put(t, s, "manifest")
	h := mustAppend(t, s, "r", g, record.Execution(att, nil))
	closed := mustCreate(t, s, "closed")
	closed = mustAppend(t, s, "closed", closed, record.Closure("done"))
	for _, tc := range []struct {
		name string
		run  string
		head record.Address
		seg  record.Segment
		want error
	}{
		{"stale head", "r", g, record.Execution(att, nil), ErrHeadMoved},
		{"zero head", "r", record.Address{}, record.Execution(att, nil), ErrHeadMoved},
		{"missing attestation", "r", h, record.Execution(record.Sum([]byte("absent")), nil), ErrMissingObject},
		{"missing manifest", "r", h, record.Suspension(record.TranscriptSnapshot(tr), record.Sum([]byte("absent"))), ErrMissingObject},
		{"missing snapshot", "r", h, record.Suspension(record.TranscriptSnapshot(record.Sum([]byte("absent"))), man), ErrMissingObject},
		{"malformed snapshot", "r", h, record.Suspension(record.Snapshot{}, man), record.ErrMalformedSnapshot},
		{"stray field", "r", h, record.Segment{Kind: record.Executed, Attestation: att, Reason: "x"}, record.ErrMalformedSegment},
		{"not parked", "r", h, record.Resumption(record.TranscriptSnapshot(tr), 1, record.Estimated), record.ErrNotParked},
		{"after close", "closed", closed, record.Execution(att, nil), record.ErrClosed},
		{"no run", "nope", h, record.Execution(att, nil), ErrNoRun},
	} {
		before, _ := s.Run(tc.run)
		_, err := s.Append(tc.run, tc.head, tc.seg)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
		}
		if tc.want != ErrNoRun && !strings.Contains(err.Error(), tc.run) {
			t.Errorf("%s: error %q does not name the run", tc.name, err)
		}
		if after, _ := s.Run(tc.run); !equalRun(after, before) {
			t.Errorf("%s: refused append changed the run: %+v → %+v", tc.name, before, after)
		}
	}
	var se *record.SegmentError
	if _, err := s.Append("r", h, record.Resumption(record.TranscriptSnapshot(tr), 1, record.Estimated)); !errors.As(err, &se) || se.Index != 1 {
		t.Fatalf("phase refusal should be a *record.SegmentError naming index 1: %v", err)
	}
}

func equalRun(a, b Run) bool {
	return a.ID == b.ID && a.Head == b.Head && a.Len == b.Len && a.Phase == b.Phase && a.Parked.Equal(b.Parked)
}

func TestConcurrentWritersOneWins(t *testing.T) {
	s := mustStore(t)
	mustCreate(t, s, "r")
	att := put(t, s, "att")
	const rounds, writers = 30, 8
	for round := range rounds {
		head, _ := s.Head("r")
		var wg sync.WaitGroup
		var mu sync.Mutex
		wins := 0
		for range writers {
			wg.Go(func() {
				_, err := s.Append("r", head, record.Execution(att, nil))
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					wins++
				case !errors.Is(err, ErrHeadMoved):
					t.Error(err)
				}
			})
		}
		wg.Wait()
		if wins != 1 {
			t.Fatalf("round %d: %d writers succeeded on one expected head", round, wins)
		}
	}
	if run, _ := s.Run("r"); run.Len != rounds {
		t.Fatalf("%d segments after %d rounds", run.Len, rounds)
	}
}

// 64 runs written concurrently, with stale-head writers mixed in: group
// commit batches them, and no refusal disturbs another's append.
func TestGroupCommitManyRuns(t *testing.T) {
	s := mustStore(t)
	att := put(t, s, "att")
	const runs, each = 64, 20
	genesis := make([]record.Address, runs)
	for i := range runs {
		genesis[i] = mustCreate(t, s, fmt.Sprintf("run-%02d", i))
	}
	var wg sync.WaitGroup
	for i := range runs {
		id := fmt.Sprintf("run-%02d", i)
		wg.Go(func() {
			h := genesis[i]
			for range each {
				next, err := s.Append(id, h, record.Execution(att, nil))
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := s.Append(id, h, record.Execution(att, nil)); !errors.Is(err, ErrHeadMoved) {
					t.Errorf("%s: stale writer: %v", id, err)
				}
				h = next
			}
		})
	}
	wg.Wait()
	for i := range runs {
		if run, _ := s.Run(fmt.Sprintf("run-%02d", i)); run.Len != each {
			t.Fatalf("run %d has %d segments, want %d", i, run.Len, each)
		}
	}
}

// A function that fails after writing rolls back its whole batch; every
// other function of the batch is then committed alone, and the failing
// one's write is nowhere.
func TestGroupCommitFailureAfterWrite(t *testing.T) {
	s := mustStore(t)
	bkt := []byte("test-scratch")
	if err := s.commit(func(tx *bolt.Tx) error { _, err := tx.CreateBucket(bkt); return err }); err != nil {
		t.Fatal(err)
	}
	write := func(key string, fail error) *commitReq {
		return &commitReq{err: make(chan error, 1), fn: func(tx *bolt.Tx) error {
			if err := tx.Bucket(bkt).Put([]byte(key), []byte("v")); err != nil {
				return err
			}
			return fail
		}}
	}
	boom := errors.New("boom")
	batch := []*commitReq{write("a", nil), write("b", boom), write("c", nil),
		{err: make(chan error, 1), fn: func(*bolt.Tx) error { return refuse(ErrHeadMoved) }}}
	s.run(batch) // one batch, as the commit loop would run it
	for i, want := range []error{nil, boom, nil, ErrHeadMoved} {
		if err := <-batch[i].err; !errors.Is(err, want) || (want == nil && err != nil) {
			t.Errorf("request %d: %v, want %v", i, err, want)
		}
	}
	s.view(func(tx *bolt.Tx) error {
		b := tx.Bucket(bkt)
		if b.Get([]byte("a")) == nil || b.Get([]byte("c")) == nil || b.Get([]byte("b")) != nil {
			t.Error("batch failure: wrong writes committed")
		}
		return nil
	})
	s.commit(func(tx *bolt.Tx) error { return tx.DeleteBucket(bkt) })
}

func TestRunsByPhase(t *testing.T) {
	s := mustStore(t)
	att, man, tr := put(t, s, "att"), put(t, s, "man"), put(t, s, "transcript")
	for i, want := range []record.Phase{record.PhaseExecuting, record.PhaseParked, record.PhaseClosed, record.PhaseParked, record.PhaseExecuting} {
		id := fmt.Sprintf("run-%d", i)
		h := mustCreate(t, s, id)
		h = mustAppend(t, s, id, h, record.Execution(att, &record.CallAccount{}))
		if want != record.PhaseExecuting || i == 4 {
			h = mustAppend(t, s, id, h, record.Suspension(record.TranscriptSnapshot(tr), man))
		}
		switch {
		case want == record.PhaseClosed:
			mustAppend(t, s, id, h, record.Closure("done"))
		case i == 4:
			mustAppend(t, s, id, h, record.Resumption(record.TranscriptSnapshot(tr), 5, record.Measured))
		}
	}
	for p, want := range map[record.Phase][]string{
		record.PhaseExecuting: {"run-0", "run-4"},
		record.PhaseParked:    {"run-1", "run-3"},
		record.PhaseClosed:    {"run-2"},
	} {
		ids, err := s.Runs(p)
		if err != nil || !slices.Equal(ids, want) {
			t.Errorf("%s: %v %v, want %v", p, ids, err, want)
		}
	}
	all, _ := s.AllRuns()
	if len(all) != 5 {
		t.Fatalf("all runs: %v", all)
	}
	if _, err := s.Runs(record.Phase(9)); err == nil {
		t.Fatal("unknown phase listed")
	}
}

func TestCreateRefusals(t *testing.T) {
	s := mustStore(t)
	mustCreate(t, s, "r")
	if _, err := s.Create("r", record.Address{}, record.Address{}); !errors.Is(err, ErrRunExists) {
		t.Fatalf("duplicate: %v", err)
	}
	for _, id := range []string{"", strings.Repeat("x", MaxRunIDLen+1), "bad\xff"} {
		if _, err := s.Create(id, record.Address{}, record.Address{}); !errors.Is(err, ErrRunID) {
			t.Errorf("id %q: %v", id, err)
		}
	}
	if _, err := s.Run("absent"); !errors.Is(err, ErrNoRun) {
		t.Fatal(err)
	}
	if _, err := s.Record("absent"); !errors.Is(err, ErrNoRun) {
		t.Fatal(err)
	}
}

func TestImport(t *testing.T) {
	s := mustStore(t)
	att, tr, man := put(t, s, "att"), put(t, s, "transcript"), put(t, s, "manifest")
	r := record.New(record.Sum([]byte("u")), record.Sum([]byte("g")))
	r.Append(record.Execution(att, nil))
	r.Append(record.Suspension(record.TranscriptSnapshot(tr), man))
	if err := s.Import("imported", r); err != nil {
		t.Fatal(err)
	}
	got, err := s.Record("imported")
	if err != nil || got.Head() != r.Head() || got.Phase() != record.PhaseParked {
		t.Fatal(err)
	}
	if ids, _ := s.Runs(record.PhaseParked); !slices.Equal(ids, []string{"imported"}) {
		t.Fatalf("parked: %v", ids)
	}
	// Appending continues from the imported head.
	mustAppend(t, s, "imported", r.Head(), record.Resumption(record.TranscriptSnapshot(tr), 7, record.Measured))
	if err := s.Import("imported", r); !errors.Is(err, ErrRunExists) {
		t.Fatal(err)
	}
	r2 := record.New(record.Sum([]byte("u")), record.Sum([]byte("g")))
	r2.Append(record.Execution(record.Sum([]byte("absent")), nil))
	if err := s.Import("other", r2); !errors.Is(err, ErrMissingObject) {
		t.Fatal(err)
	}
	if _, err := s.Run("other"); !errors.Is(err, ErrNoRun) {
		t.Fatal("refused import left a run")
	}
}

func TestClosedStore(t *testing.T) {
	s, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := s.Create("r", record.Address{}, record.Address{}); !errors.Is(err, ErrClosed) {
		t.Fatalf("create after close: %v", err)
	}
	if err := s.Close(); !errors.Is(err, ErrClosed) {
		t.Fatalf("second close: %v", err)
	}
}

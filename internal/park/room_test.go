package park

import (
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// freeOf is a filesystem with n bytes free.
func freeOf(n uint64) func(string) (uint64, error) {
	return func(string) (uint64, error) { return n, nil }
}

func quota(n uint64) unit.Grants { return unit.Grants{Limits: unit.Limits{SnapshotBytes: n}} }

// parkedSegs is a record's segments that park twice on one image snapshot
// (a resume and a park again without a change), once on a transcript, and
// once on a second image snapshot; it returns them and the bytes the two
// image snapshots hold.
func parkedSegs(t *testing.T, st *store.Store) ([]record.Segment, uint64) {
	t.Helper()
	mem := plainIngest(t, st, map[string][]byte{"pages-1.img": content(41, 5000)})
	one := record.ImageSnapshot(plainIngest(t, st, map[string][]byte{RootfsName: content(42, 3000)}), &mem)
	two := record.ImageSnapshot(plainIngest(t, st, map[string][]byte{RootfsName: content(43, 700)}), nil)
	ta, err := st.PutBytes(content(44, 100_000))
	if err != nil {
		t.Fatal(err)
	}
	var used uint64
	for _, s := range []record.Snapshot{one, two} {
		n, err := Retained(st, s)
		if err != nil {
			t.Fatal(err)
		}
		used += uint64(n)
	}
	att, man := record.Sum([]byte("attestation")), record.Sum([]byte("manifest"))
	return []record.Segment{
		record.Execution(att, nil), record.Suspension(one, man),
		record.Resumption(one, 1, record.Estimated),
		record.Execution(att, nil), record.Suspension(one, man),
		record.Resumption(one, 1, record.Estimated),
		record.Execution(att, nil), record.Suspension(record.TranscriptSnapshot(ta), man),
		record.Resumption(record.TranscriptSnapshot(ta), 1, record.Estimated),
		record.Execution(att, nil), record.Suspension(two, man),
	}, used
}

// A filesystem without the dump's size plus the minimum free refuses the
// park before it writes, with ErrNoSpace and the numbers; 0 means the
// default minimum.
func TestRoomTooLittleFree(t *testing.T) {
	st := mustStore(t)
	const mem = 100 << 20
	need := uint64(mem + margin)
	for _, c := range []struct{ free, minFree, want uint64 }{
		{need - 1, 1, 1},
		{need + 999, 1000, 1000},
		{need + DefaultMinFree - 1, 0, DefaultMinFree},
	} {
		_, err := room(st, freeOf(c.free), Sizing{Run: "r", Grants: quota(1 << 40), Memory: mem, MinFree: c.minFree})
		want := fmt.Sprintf("run r: no room for the park: the store's filesystem has %d bytes free; a park of this unit writes about %d and must leave %d (--min-free)", c.free, need, c.want)
		if !errors.Is(err, ErrNoSpace) || err.Error() != want {
			t.Errorf("free %d, min %d: %v", c.free, c.minFree, err)
		}
	}
	if _, err := room(st, freeOf(need+1000), Sizing{Run: "r", Grants: quota(1 << 40), Memory: mem, MinFree: 1000}); err != nil {
		t.Errorf("exactly the minimum left: %v", err)
	}
	// The real filesystem cannot keep 2^62 bytes free.
	if _, err := Room(st, Sizing{Run: "r", Grants: quota(1 << 40), Memory: mem, MinFree: 1 << 62}); !errors.Is(err, ErrNoSpace) {
		t.Errorf("statfs: %v", err)
	}
}

// A filesystem that cannot be asked is an error, not a refusal for room.
func TestRoomStatfsFails(t *testing.T) {
	st := mustStore(t)
	_, err := room(st, func(string) (uint64, error) { return 0, syscall.EIO }, Sizing{Run: "r", Grants: quota(1 << 40), Memory: 0, MinFree: 1})
	if !errors.Is(err, syscall.EIO) || errors.Is(err, ErrNoSpace) || !strings.HasPrefix(err.Error(), "store filesystem: ") {
		t.Fatalf("room: %v", err)
	}
}

// The run's snapshots count against its quota each once, however many
// parks name them; transcripts do not count. A park that would pass the
// quota is refused with ErrNoSpace; one that fits exactly is not.
func TestRoomQuotaCountsEachSnapshotOnce(t *testing.T) {
	st := mustStore(t)
	segs, used := parkedSegs(t, st)
	const mem = 1 << 20
	need := uint64(mem + margin)
	_, err := room(st, freeOf(1<<50), Sizing{Run: "r", Grants: quota(used + need - 1), Memory: mem, Segments: segs, MinFree: 1})
	want := fmt.Sprintf("run r: no room for the park: its snapshots hold %d bytes, this park would add about %d, and its snapshot quota is %d bytes (limits.snapshot_bytes)", used, need, used+need-1)
	if !errors.Is(err, ErrNoSpace) || err.Error() != want {
		t.Fatalf("over quota: %v", err)
	}
	if n, err := room(st, freeOf(1<<50), Sizing{Run: "r", Grants: quota(used + need), Memory: mem, Segments: segs, MinFree: 1}); err != nil || n != margin {
		t.Fatalf("quota met exactly: room %d, %v", n, err)
	}
}

// The room is what is left beyond the memory image, under the quota and
// the filesystem's free space both, plus the margin: the rw layer's budget.
func TestRoomReturned(t *testing.T) {
	st := mustStore(t)
	segs, used := parkedSegs(t, st)
	const mem = 8 << 20
	need := uint64(mem + margin)
	// The quota binds.
	if n, err := room(st, freeOf(1<<40), Sizing{Run: "r", Grants: quota(used + need + 5000), Memory: mem, Segments: segs, MinFree: 1 << 20}); err != nil || n != 5000+margin {
		t.Errorf("under the quota: room %d, %v", n, err)
	}
	// The free space binds.
	if n, err := room(st, freeOf(need+(1<<20)+7000), Sizing{Run: "r", Grants: quota(1 << 40), Memory: mem, Segments: segs, MinFree: 1 << 20}); err != nil || n != 7000+margin {
		t.Errorf("under the free space: room %d, %v", n, err)
	}
	// No limit binds: capped.
	if n, err := room(st, freeOf(1<<63), Sizing{Run: "r", Grants: quota(1 << 63), Memory: mem, MinFree: 1}); err != nil || n != 1<<62 {
		t.Errorf("unbounded: room %d, %v", n, err)
	}
	// No quota in the grants: the default's.
	if n, err := room(st, freeOf(1<<50), Sizing{Run: "r", Grants: unit.Grants{}, Memory: mem, MinFree: 1}); err != nil || n != int64(unit.DefaultLimits.SnapshotBytes-need+margin) {
		t.Errorf("default quota: room %d, %v", n, err)
	}
}

// A park's statistics go into the journal field for field.
func TestResultCheckpointed(t *testing.T) {
	r := Result{Ingest: 14, Stats: executor.CheckpointStats{Total: 1, Pause: 2, Dump: 3, Diff: 4, Freezing: 5, Frozen: 6, MemDump: 7, MemWrite: 8,
		PagesWritten: 9, PagesScanned: 10, ImageBytes: 11, RootfsBytes: 12}}
	want := attest.Checkpointed{TotalNS: 1, PauseNS: 2, DumpNS: 3, DiffNS: 4, FreezingNS: 5, FrozenNS: 6, MemDumpNS: 7, MemWriteNS: 8,
		Pages: 9, PagesScan: 10, ImageBytes: 11, RootBytes: 12, IngestNS: int64(14 * time.Nanosecond)}
	if got := r.Checkpointed(); got != want {
		t.Fatalf("checkpointed %+v, want %+v", got, want)
	}
}

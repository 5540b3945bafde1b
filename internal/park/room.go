package park

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// ErrNoSpace refuses an image park before it writes anything: the store's
// filesystem has too little room for the dump, or the run's snapshots would
// pass its snapshot quota (Limits.SnapshotBytes). The unit goes on running
// and the record is as it was (docs/limits.md).
var ErrNoSpace = errors.New("no room for the park")

// DefaultMinFree is the free space an image park leaves on the store's
// filesystem, beyond what it expects to write.
const DefaultMinFree = 1 << 30

// margin is added to a unit's memory for the image's own overhead and a
// small rw layer.
const margin = 16 << 20

// Sizing is what the room for an image park is judged from.
type Sizing struct {
	Run      string
	Grants   unit.Grants      // the run's grants: its snapshot quota
	Memory   uint64           // the bytes of memory its unit uses
	Segments []record.Segment // the run's record: the snapshots it retains
	MinFree  uint64           // the free space a park leaves (DefaultMinFree when 0)
}

// Room checks, before an image park, that the store's filesystem keeps
// s.MinFree after the dump, and that the run's snapshots, this one
// included and each counted once however many parks name it, stay within
// its quota (its grants' Limits.SnapshotBytes). It returns the room left
// beyond the memory image: the budget of the park's rw layer, for
// [Image]'s maxRootfs. A refusal wraps [ErrNoSpace].
func Room(st *store.Store, s Sizing) (int64, error) {
	return room(st, statfsFree, s)
}

// statfsFree is the bytes an unprivileged writer may still use on dir's
// filesystem.
func statfsFree(dir string) (uint64, error) {
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err != nil {
		return 0, err
	}
	return fs.Bavail * uint64(fs.Bsize), nil
}

// room is Room with the filesystem's free space told by free.
func room(st *store.Store, free func(dir string) (uint64, error), s Sizing) (int64, error) {
	id, grants, mem, segs, minFree := s.Run, s.Grants, s.Memory, s.Segments, s.MinFree
	need := mem + margin
	avail, err := free(st.Dir())
	if err != nil {
		return 0, fmt.Errorf("store filesystem: %w", err)
	}
	if minFree == 0 {
		minFree = DefaultMinFree
	}
	if avail < need || avail-need < minFree {
		return 0, fmt.Errorf("run %s: %w: the store's filesystem has %d bytes free; a park of this unit writes about %d and must leave %d (--min-free)",
			id, ErrNoSpace, avail, need, minFree)
	}
	quota := grants.Limits.Or(unit.DefaultLimits).SnapshotBytes
	used, err := retainedImages(st, segs)
	if err != nil {
		return 0, err
	}
	if used+need > quota {
		return 0, fmt.Errorf("run %s: %w: its snapshots hold %d bytes, this park would add about %d, and its snapshot quota is %d bytes (limits.snapshot_bytes)",
			id, ErrNoSpace, used, need, quota)
	}
	left := min(quota-used-need, avail-need-minFree) + margin
	return int64(min(left, 1<<62)), nil
}

// retainedImages is the bytes the image snapshots that segs park on hold
// in st, each snapshot root counted once.
func retainedImages(st *store.Store, segs []record.Segment) (uint64, error) {
	var used uint64
	seen := map[record.Address]bool{}
	for _, s := range segs {
		if s.Kind != record.Suspended || s.Snapshot.IsTranscript() || seen[*s.Snapshot.Root] {
			continue
		}
		seen[*s.Snapshot.Root] = true
		n, err := Retained(st, s.Snapshot)
		if err != nil {
			return 0, err
		}
		used += uint64(n)
	}
	return used, nil
}

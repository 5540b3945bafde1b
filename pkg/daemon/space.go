package daemon

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/pkg/park"
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

// parkMargin is added to a unit's memory for the image's own overhead and
// a small rw layer.
const parkMargin = 16 << 20

// roomForPark checks, before an image park of run id whose unit uses mem
// bytes of memory, that the store's filesystem keeps MinFree after the
// dump, and that the run's snapshots, this one included, stay within its
// quota. It returns the room left beyond the memory image: the budget of
// the park's rw layer.
func (d *Daemon) roomForPark(id string, grants unit.Grants, mem uint64, segs []record.Segment) (int64, error) {
	need := mem + parkMargin
	var fs unix.Statfs_t
	if err := unix.Statfs(d.st.Dir(), &fs); err != nil {
		return 0, fmt.Errorf("store filesystem: %w", err)
	}
	free := fs.Bavail * uint64(fs.Bsize)
	minFree := d.cfg.MinFree
	if minFree == 0 {
		minFree = DefaultMinFree
	}
	if free < need || free-need < minFree {
		return 0, fmt.Errorf("run %s: %w: the store's filesystem has %d bytes free; a park of this unit writes about %d and must leave %d (--min-free)",
			id, ErrNoSpace, free, need, minFree)
	}
	quota := grants.Limits.Or(unit.DefaultLimits).SnapshotBytes
	var used uint64
	seen := map[record.Address]bool{}
	for _, s := range segs {
		if s.Kind != record.Suspended || s.Snapshot.IsTranscript() || seen[*s.Snapshot.Root] {
			continue
		}
		seen[*s.Snapshot.Root] = true
		n, err := park.Retained(d.st, s.Snapshot)
		if err != nil {
			return 0, err
		}
		used += uint64(n)
	}
	if used+need > quota {
		return 0, fmt.Errorf("run %s: %w: its snapshots hold %d bytes, this park would add about %d, and its snapshot quota is %d bytes (limits.snapshot_bytes)",
			id, ErrNoSpace, used, need, quota)
	}
	room := min(quota-used-need, free-need-minFree) + parkMargin
	return int64(min(room, 1<<62)), nil
}

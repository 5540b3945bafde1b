package store

import (
	"context"
	"fmt"
	"os"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// GCStats reports a collection.
type GCStats struct {
	Live    int // objects kept because a record reaches them
	Young   int // unreachable objects kept, younger than the grace period
	Removed int

	LiveBytes, YoungBytes, RemovedBytes int64
}

// Kept is the number of objects left in the store.
func (g GCStats) Kept() int { return g.Live + g.Young }

// GC removes every object no record reaches — as its run's stored unit or
// grants, named by a segment, or through declared refs — and no call
// ledger names (a call object, a posted result), except those
// written or put again within grace: objects are put before the segment
// that names them, so a young unreachable object may be about to be named. It needs every record to verify, and refuses to
// collect otherwise. While it runs, appends, imports, puts and ingests
// wait, so nothing is named between the mark and the sweep.
func (s *Store) GC(ctx context.Context, grace time.Duration) (GCStats, error) {
	s.gc.Lock()
	defer s.gc.Unlock()
	var st GCStats
	live, err := s.reachable(ctx)
	if err != nil {
		return st, fmt.Errorf("store %s: gc: %w", s.dir, err)
	}
	cutoff := time.Now().Add(-grace)
	err = s.walkObjects(func(a record.Address, p string, info os.FileInfo) error {
		switch {
		case live[a]:
			st.Live++
			st.LiveBytes += info.Size()
		case info.ModTime().After(cutoff):
			st.Young++
			st.YoungBytes += info.Size()
		default:
			if err := ctx.Err(); err != nil {
				return err
			}
			if err := os.Remove(p); err != nil {
				return err
			}
			st.Removed++
			st.RemovedBytes += info.Size()
		}
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("store %s: gc: %w", s.dir, err)
	}
	// Drop the refs of every object no longer stored: those just removed,
	// and those a crash left between recording refs and sealing. No put is
	// in flight (it would hold s.gc), so none of these is about to appear.
	err = s.commit(func(tx *bolt.Tx) error {
		var gone [][]byte
		err := tx.Bucket(bktRefs).ForEach(func(k, _ []byte) error {
			if len(k) != 32 {
				return fmt.Errorf("%w: refs key of %d bytes", ErrDamaged, len(k))
			}
			if !s.Has(record.Address(k)) {
				gone = append(gone, k)
			}
			return nil
		})
		if err != nil {
			return refuse(err)
		}
		for _, k := range gone {
			if err := tx.Bucket(bktRefs).Delete(k); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("store %s: gc: %w", s.dir, err)
	}
	return st, nil
}

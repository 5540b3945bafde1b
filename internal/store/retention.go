package store

import (
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Retention. A closed run keeps its record and its evidence (unit, grants,
// attestations with their receipts and journals, manifests, transcripts)
// for as long as the store holds it. Its image snapshots — memory images
// and root filesystems, by far the largest objects — are released by
// [Store.Release] once the daemon's retention time has passed, unless the
// run is pinned; [Store.GC] then removes the objects no other run reaches.
// A released run verifies as before, without its image snapshots.

func nowNS() []byte { return binary.BigEndian.AppendUint64(nil, uint64(time.Now().UnixNano())) }

func decodeNS(v []byte) (time.Time, bool) {
	if len(v) != 8 {
		return time.Time{}, false
	}
	return time.Unix(0, int64(binary.BigEndian.Uint64(v))), true
}

// Retention is what the store knows of a run's retention.
type Retention struct {
	Closed   time.Time // when the store saw the run closed; zero while open
	Pinned   bool      // its snapshots are kept whatever the retention time
	Released time.Time // when its image snapshots were released; zero if not
	// Imported is when the run's record last arrived here in a bundle
	// (Import or Extend), and ImportedLen how many segments it had then;
	// zero for a run that started here and never left. This host has held
	// the snapshot parked at that length only since then.
	Imported    time.Time
	ImportedLen int
}

// RetentionOf returns run's retention.
func (s *Store) RetentionOf(run string) (Retention, error) {
	var r Retention
	err := s.view(func(tx *bolt.Tx) error {
		if _, err := getState(tx, run); err != nil {
			return err
		}
		r.Closed, _ = decodeNS(tx.Bucket(bktClosed).Get([]byte(run)))
		r.Pinned = tx.Bucket(bktPins).Get([]byte(run)) != nil
		r.Released, _ = decodeNS(tx.Bucket(bktFreed).Get([]byte(run)))
		if v := tx.Bucket(bktArrive).Get([]byte(run)); len(v) == 16 {
			r.Imported, _ = decodeNS(v[:8])
			r.ImportedLen = int(binary.BigEndian.Uint64(v[8:]))
		}
		return nil
	})
	return r, err
}

// Pin keeps run's snapshots whatever the retention time; a run released
// already stays released (its images are gone).
func (s *Store) Pin(run string) error {
	return s.commit(func(tx *bolt.Tx) error {
		if _, err := getState(tx, run); err != nil {
			return refuse(err)
		}
		return tx.Bucket(bktPins).Put([]byte(run), nil)
	})
}

// Unpin lets run's snapshots go with the retention time again.
func (s *Store) Unpin(run string) error {
	return s.commit(func(tx *bolt.Tx) error {
		if _, err := getState(tx, run); err != nil {
			return refuse(err)
		}
		return tx.Bucket(bktPins).Delete([]byte(run))
	})
}

// Release lets run's image snapshots go: from now on neither GC nor Check
// counts them as reached by its record. The run must be closed, or held
// elsewhere (handed off, or a copy: it is resumed elsewhere, and a bundle
// bringing it back carries every snapshot again). A run that is neither,
// or is pinned, held or owing ([ErrOwed]), is refused; releasing a
// released run is a no-op.
func (s *Store) Release(run string) error {
	return s.commit(func(tx *bolt.Tx) error {
		st, err := getState(tx, run)
		if err != nil {
			return refuse(err)
		}
		if st.phase != record.PhaseClosed && tx.Bucket(bktHandof).Get([]byte(run)) == nil {
			return refuse(fmt.Errorf("run %s: only the snapshots of a closed run, or of one held elsewhere, are released (it is %s)", run, phaseName(st.phase, true)))
		}
		if tx.Bucket(bktPins).Get([]byte(run)) != nil {
			return refuse(fmt.Errorf("run %s: pinned: its snapshots are kept", run))
		}
		if tx.Bucket(bktHolds).Get([]byte(run)) != nil {
			return refuse(fmt.Errorf("run %s: held for the host it was handed to: its snapshots are kept", run))
		}
		if tx.Bucket(bktOwed).Get([]byte(run)) != nil {
			return refuse(fmt.Errorf("run %s: %w: its snapshots are kept until its source is told", run, ErrOwed))
		}
		if tx.Bucket(bktFreed).Get([]byte(run)) != nil {
			return nil
		}
		return tx.Bucket(bktFreed).Put([]byte(run), nowNS())
	})
}

// Expired returns the runs, neither pinned, held, owing nor released, that the store
// saw closed, or handed off (or stored as a copy), before cutoff.
func (s *Store) Expired(cutoff time.Time) ([]string, error) {
	var out []string
	err := s.view(func(tx *bolt.Tx) error {
		keep := func(k []byte) bool {
			return tx.Bucket(bktPins).Get(k) != nil || tx.Bucket(bktFreed).Get(k) != nil || tx.Bucket(bktHolds).Get(k) != nil ||
				tx.Bucket(bktOwed).Get(k) != nil
		}
		err := tx.Bucket(bktClosed).ForEach(func(k, v []byte) error {
			if t, ok := decodeNS(v); ok && t.Before(cutoff) && !keep(k) {
				out = append(out, string(k))
			}
			return nil
		})
		if err != nil {
			return err
		}
		return tx.Bucket(bktHandof).ForEach(func(k, v []byte) error {
			if h, ok := decodeHandoff(v); ok && h.At.Before(cutoff) && !keep(k) {
				out = append(out, string(k))
			}
			return nil
		})
	})
	return out, err
}

// AddRoot keeps stored object a (and what it refers to) whatever the
// records reach: the daemon roots every attestation it signs, because the
// next one names it as audit_prev, and an attestation whose segment was
// never appended (a park refused after signing) would otherwise be
// collected from the middle of the host's audit chain.
func (s *Store) AddRoot(a record.Address) error {
	if !s.Has(a) {
		return fmt.Errorf("%w: %s", ErrMissingObject, a)
	}
	return s.commit(func(tx *bolt.Tx) error {
		return tx.Bucket(bktRoots).Put(a[:], nil)
	})
}

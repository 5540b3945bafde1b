package store

import (
	"encoding/binary"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// A run has one timeline. The store indexes every run by its genesis
// head, so a second run of one genesis (an import of a bundle already
// held, under any id) is refused, and it remembers the runs held
// elsewhere: handed off by an export, or held here only as a copy. Such a
// run is not resumed here until a record that extends it comes back as a
// handoff ([Store.Extend]).

// Handoff is how a run is held elsewhere.
type Handoff struct {
	Head record.Address // the head it was handed off (or copied) at
	// Copy: this host holds an imported copy, exported without a
	// handoff; the run lives where it was copied from.
	Copy bool
	At   time.Time // when it was handed off, or the copy stored
}

// encode: head (32) ‖ kind (1: 0 handed off, 1 copy) ‖ time (8, Unix ns).
func (h Handoff) encode() []byte {
	b := append([]byte(nil), h.Head[:]...)
	k := byte(0)
	if h.Copy {
		k = 1
	}
	return binary.BigEndian.AppendUint64(append(b, k), uint64(h.At.UnixNano()))
}

func decodeHandoff(v []byte) (Handoff, bool) {
	if len(v) != 41 || v[32] > 1 {
		return Handoff{}, false
	}
	at, _ := decodeNS(v[33:])
	return Handoff{Head: record.Address(v[:32]), Copy: v[32] == 1, At: at}, true
}

// claimGenesis indexes run under genesis g, refusing a genesis another run
// holds.
func claimGenesis(tx *bolt.Tx, run string, g record.Address) error {
	genes := tx.Bucket(bktGenes)
	if held := genes.Get(g[:]); held != nil && string(held) != run {
		return refuse(fmt.Errorf("run %s: %w: run %s (genesis %s)", run, ErrGenesisHeld, held, g))
	}
	return genes.Put(g[:], []byte(run))
}

// RunOfGenesis returns the id of the run whose genesis is g, if the store
// holds one.
func (s *Store) RunOfGenesis(g record.Address) (string, bool, error) {
	var id string
	var ok bool
	err := s.view(func(tx *bolt.Tx) error {
		if v := tx.Bucket(bktGenes).Get(g[:]); v != nil {
			id, ok = string(v), true
		}
		return nil
	})
	return id, ok, err
}

// HandOff marks parked run as handed off at head: its bundle (whose record
// ends at head) is leaving for another host. Nothing may be appended to a
// handed-off run until a record extending head is imported back
// ([Store.Extend]); the daemon refuses to resume or close it. A run that
// is not parked, or whose head is not head, is refused ([ErrHeadMoved]).
// Handing off a run already handed off at head is a no-op; a run held as
// a copy stays a copy.
func (s *Store) HandOff(run string, head record.Address) error {
	return s.commit(func(tx *bolt.Tx) error {
		st, err := getState(tx, run)
		if err != nil {
			return refuse(err)
		}
		if st.head != head {
			return refuse(fmt.Errorf("run %s: %w: handing off at %s, head is %s", run, ErrHeadMoved, head, st.head))
		}
		if st.phase != record.PhaseParked {
			return refuse(fmt.Errorf("run %s: only a parked run is handed off (it is %s)", run, phaseName(st.phase, true)))
		}
		if tx.Bucket(bktHandof).Get([]byte(run)) != nil {
			return nil
		}
		return tx.Bucket(bktHandof).Put([]byte(run), Handoff{Head: head, At: time.Now()}.encode())
	})
}

// Reclaim clears run's handoff made at head: the export that made it did
// not deliver its bundle whole. A copy, or a handoff at another head, is
// left as it is.
func (s *Store) Reclaim(run string, head record.Address) error {
	return s.commit(func(tx *bolt.Tx) error {
		h, ok := decodeHandoff(tx.Bucket(bktHandof).Get([]byte(run)))
		if !ok || h.Copy || h.Head != head {
			return nil
		}
		if err := endHold(tx, run); err != nil {
			return err
		}
		return tx.Bucket(bktHandof).Delete([]byte(run))
	})
}

// TakeOver makes run, held here as a copy or handed off at head, this
// host's again, with its record as it is: the run is parked at head, and
// the fleet has given it to this host (an orphan adopted, docs/fleet.md).
// A run held here already is left as it is; a run whose head, or whose
// copy's or handoff's head, is not head is refused ([ErrHeadMoved]).
func (s *Store) TakeOver(run string, head record.Address) error {
	return s.commit(func(tx *bolt.Tx) error {
		st, err := getState(tx, run)
		if err != nil {
			return refuse(err)
		}
		if st.head != head || st.phase != record.PhaseParked {
			return refuse(fmt.Errorf("run %s: %w: at %s (%s), not parked at %s", run, ErrHeadMoved, st.head, phaseName(st.phase, true), head))
		}
		h, ok := decodeHandoff(tx.Bucket(bktHandof).Get([]byte(run)))
		if !ok {
			return nil
		}
		if h.Head != head {
			return refuse(fmt.Errorf("run %s: %w: held elsewhere since %s, not %s", run, ErrHeadMoved, h.Head, head))
		}
		if err := endHold(tx, run); err != nil {
			return err
		}
		return tx.Bucket(bktHandof).Delete([]byte(run))
	})
}

// HandedOff reports whether run is held elsewhere, and how.
func (s *Store) HandedOff(run string) (Handoff, bool, error) {
	var h Handoff
	var ok bool
	err := s.view(func(tx *bolt.Tx) error {
		v := tx.Bucket(bktHandof).Get([]byte(run))
		if v == nil {
			return nil
		}
		if h, ok = decodeHandoff(v); !ok {
			return fmt.Errorf("run %s: %w: handoff of %d bytes", run, ErrDamaged, len(v))
		}
		return nil
	})
	return h, ok, err
}

// markArrival records when, and at which length, run's record arrived in
// a bundle; and, for a copy, holds the run as a copy at its head.
func markArrival(tx *bolt.Tx, run string, r *record.Record, copy bool) error {
	v := binary.BigEndian.AppendUint64(nowNS(), uint64(r.Len()))
	if err := tx.Bucket(bktArrive).Put([]byte(run), v); err != nil {
		return err
	}
	if err := endHold(tx, run); err != nil {
		return err
	}
	if copy {
		if r.Phase() != record.PhaseParked {
			return refuse(fmt.Errorf("run %s: a copy is of a parked run (this one is %s)", run, r.Phase()))
		}
		if err := tx.Bucket(bktHandof).Put([]byte(run), Handoff{Head: r.Head(), Copy: true, At: time.Now()}.encode()); err != nil {
			return err
		}
	} else if err := tx.Bucket(bktHandof).Delete([]byte(run)); err != nil {
		return err
	}
	// The bundle brought every snapshot again: none is released.
	return tx.Bucket(bktFreed).Delete([]byte(run))
}

// CheckExtend reports, without writing, whether r may be imported over run
// by [Store.Extend] (reclaim as there).
func (s *Store) CheckExtend(run string, r *record.Record, reclaim bool) error {
	held, err := s.Run(run)
	if err != nil {
		return err
	}
	h, ok, err := s.HandedOff(run)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("run %s: %w (this host holds it, and did not hand it off)", run, ErrRunExists)
	}
	return extends(run, held, h, r, reclaim)
}

// extends judges r against held, handed off (or copied) as h.
func extends(run string, held Run, h Handoff, r *record.Record, reclaim bool) error {
	if r.Genesis() != record.Genesis(held.Unit, held.Grants) {
		return fmt.Errorf("run %s: %w: another genesis", run, ErrNotExtension)
	}
	if r.Phase() != record.PhaseParked {
		return fmt.Errorf("run %s: %w: a run comes back parked (this record is %s)", run, ErrNotExtension, r.Phase())
	}
	if r.Len() < held.Len || held.Len > 0 && r.HeadAt(held.Len-1) != held.Head {
		return fmt.Errorf("run %s: %w: the record held (%d segments, head %s) is not a prefix of the one imported", run, ErrNotExtension, held.Len, held.Head)
	}
	if r.Len() == held.Len && !reclaim && !h.Copy {
		return fmt.Errorf("run %s: %w: the record adds nothing to the one handed off; if no other host resumed from that bundle, import it again with reclaim", run, ErrNotExtension)
	}
	// What another host added is whole intervals: Resumed, one or more
	// Executed (each attested: the importer checks their signatures),
	// Suspended.
	want := record.Resumed
	for i := held.Len; i < r.Len(); i++ {
		k := r.Segment(i).Kind
		switch {
		case k == want:
		case want == record.Suspended && k == record.Executed:
		default:
			return fmt.Errorf("run %s: %w: segment %d is %s; what comes back is whole intervals (resumed, executed, suspended)", run, ErrNotExtension, i, k)
		}
		switch k {
		case record.Resumed:
			want = record.Executed
		case record.Executed:
			want = record.Suspended
		case record.Suspended:
			want = record.Resumed
		}
	}
	return nil
}

// Extend imports r over run, held elsewhere: r must have the run's genesis,
// be parked, carry the run's head at the run's length — the same timeline
// — and add whole intervals (resumed, executed…, suspended). A record that
// adds nothing is refused unless reclaim: the operator takes back a run
// whose bundle no other host resumed from. The new segments are appended
// (each judged by pkg/record, after every object they name is in the
// store) and the handoff cleared, or the run held as a copy (copy), in one
// transaction. A run not held elsewhere is [ErrRunExists]; a record that
// does not extend it, [ErrNotExtension].
func (s *Store) Extend(run string, r *record.Record, copy, reclaim bool) (record.Address, error) {
	if err := r.Verify(); err != nil {
		return record.Address{}, fmt.Errorf("run %s: %w", run, err)
	}
	held, err := s.Run(run)
	if err != nil {
		return record.Address{}, err
	}
	if err := s.CheckExtend(run, r, reclaim); err != nil {
		return record.Address{}, err
	}
	segs := make([]record.Segment, 0, r.Len()-held.Len)
	for i := held.Len; i < r.Len(); i++ {
		segs = append(segs, r.Segment(i))
	}
	return s.appendAll(run, held.Head, segs, func(tx *bolt.Tx) error {
		h, ok := decodeHandoff(tx.Bucket(bktHandof).Get([]byte(run)))
		if !ok {
			return refuse(fmt.Errorf("run %s: %w (it was not handed off)", run, ErrRunExists))
		}
		if err := extends(run, held, h, r, reclaim); err != nil {
			return refuse(err)
		}
		return markArrival(tx, run, r, copy)
	})
}

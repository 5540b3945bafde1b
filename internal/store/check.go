package store

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// CheckStats reports what a [Store.Check] verified.
type CheckStats struct {
	Runs     int   // records verified from genesis
	Segments int   // segments in them
	Objects  int   // reachable objects rehashed
	Bytes    int64 // their total size
}

// Check is the store's fsck. It verifies, in one read transaction, that
// every run's record verifies from genesis against the heads stored beside
// its segments and against its state, that the phase index lists every
// run exactly once, under its phase, and that every run's call ledger
// agrees with its record (checkLedger: the calls on the record are
// exactly those its accounts dispatched, resolved as they say; calls of
// the open interval only while the run executes; none for a closed run,
// and no ledger of a run not stored). Then it rehashes every object the
// records reach — a run's unit and grants if stored, named by a segment,
// or through declared refs — and every object a ledger names against its
// address. The first problem found is the error.
func (s *Store) Check(ctx context.Context) (CheckStats, error) {
	return s.check(ctx, func(record.Address) bool { return false })
}

// check is [Store.Check], but it does not rehash the reachable objects
// verified reports true for (they are still counted and must be present to
// be sized). The crash test checks the store after each of its kills and
// rehashes only the objects whose files changed since its last check.
func (s *Store) check(ctx context.Context, verified func(record.Address) bool) (CheckStats, error) {
	var cs CheckStats
	var live map[record.Address]bool
	err := s.view(func(tx *bolt.Tx) error {
		indexed, err := phaseIndex(tx)
		if err != nil {
			return err
		}
		var roots []record.Address
		var segs uint64
		err = tx.Bucket(bktRuns).ForEach(func(k, _ []byte) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			id := string(k)
			r, err := readRecord(tx, id)
			if err != nil {
				return err
			}
			p, ok := indexed[id]
			if !ok || p != r.Phase() {
				return fmt.Errorf("run %s: %w: %s, but the phase index has it %s", id, ErrDamaged, r.Phase(), phaseName(p, ok))
			}
			delete(indexed, id)
			if err := checkLedger(tx, id, r); err != nil {
				return err
			}
			roots = s.appendRecordRefs(roots, r, tx.Bucket(bktFreed).Get(k) != nil)
			cs.Runs++
			cs.Segments += r.Len()
			segs += uint64(r.Len())
			return nil
		})
		if err != nil {
			return err
		}
		// Every log entry belongs to a record: an entry none reaches was
		// written outside an append.
		if n := uint64(tx.Bucket(bktLog).Stats().KeyN); n != segs {
			return fmt.Errorf("%w: the log holds %d entries, the records %d segments", ErrDamaged, n, segs)
		}
		if len(indexed) > 0 {
			ids := slices.Sorted(maps.Keys(indexed))
			return fmt.Errorf("run %s: %w: in the phase index but not stored", ids[0], ErrDamaged)
		}
		if err := checkLedgerRuns(tx); err != nil {
			return err
		}
		roots = appendRoots(roots, tx)
		if roots, err = appendLedgerRoots(roots, tx); err != nil {
			return err
		}
		live, err = expandRefs(tx, roots)
		return err
	})
	if err != nil {
		return cs, fmt.Errorf("store %s: check: %w", s.dir, err)
	}
	n, size, err := s.rehashAll(ctx, live, verified)
	if err != nil {
		return cs, fmt.Errorf("store %s: check: %w", s.dir, err)
	}
	cs.Objects, cs.Bytes = n, size
	return cs, nil
}

// rehashAll rehashes every object in live but those verified reports true
// for, which must only be present; it returns their count and total size.
func (s *Store) rehashAll(ctx context.Context, live map[record.Address]bool, verified func(record.Address) bool) (int, int64, error) {
	addrs := make([]record.Address, 0, len(live))
	for a := range live {
		addrs = append(addrs, a)
	}
	var bytes atomic.Int64
	err := parallel(ctx, len(addrs), func(i int) error {
		if verified(addrs[i]) { // known good and unchanged: only present
			sz, err := s.Size(addrs[i])
			if err != nil {
				return fmt.Errorf("reachable object: %w", err)
			}
			bytes.Add(sz)
			return nil
		}
		if err := s.Verify(ctx, addrs[i]); err != nil {
			return fmt.Errorf("reachable object: %w", err)
		}
		sz, _ := s.Size(addrs[i])
		bytes.Add(sz)
		return nil
	})
	return len(addrs), bytes.Load(), err
}

func phaseName(p record.Phase, ok bool) string {
	if !ok {
		return "nowhere"
	}
	return p.String()
}

// phaseIndex reads the phase index: run id → phase.
func phaseIndex(tx *bolt.Tx) (map[string]record.Phase, error) {
	out := map[string]record.Phase{}
	phases := tx.Bucket(bktPhases)
	for p, key := range phaseKeys {
		b := phases.Bucket(key)
		if b == nil {
			return nil, fmt.Errorf("%w: no phase index bucket %s", ErrDamaged, key)
		}
		err := b.ForEach(func(k, _ []byte) error {
			if q, dup := out[string(k)]; dup {
				return fmt.Errorf("run %s: %w: indexed both %s and %s", k, ErrDamaged, q, record.Phase(p))
			}
			out[string(k)] = record.Phase(p)
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// appendRecordRefs appends every object r's segments name, and r's unit
// and grants ids when objects by those addresses are stored (the daemon
// stores a run's canonical spec and grant set so a bundle can carry them;
// older runs have none, and none is required).
//
// A released run's image snapshots are not reached: retention let them go
// ([Store.Release]); its record and its evidence are.
func (s *Store) appendRecordRefs(dst []record.Address, r *record.Record, released bool) []record.Address {
	for _, a := range [2]record.Address{r.Unit(), r.Grants()} {
		if s.Has(a) {
			dst = append(dst, a)
		}
	}
	for i := range r.Len() {
		seg := r.Segment(i)
		if released && !seg.Snapshot.IsTranscript() {
			seg.Snapshot = record.Snapshot{}
		}
		dst = append(dst, segmentRefs(&seg)...)
	}
	return dst
}

// reachable returns every object the records reach: a run's stored unit
// or grants, named by a segment, or declared (transitively) as a ref of
// one that is.
func (s *Store) reachable(ctx context.Context) (map[record.Address]bool, error) {
	var live map[record.Address]bool
	err := s.view(func(tx *bolt.Tx) error {
		var roots []record.Address
		err := tx.Bucket(bktRuns).ForEach(func(k, _ []byte) error {
			if err := ctx.Err(); err != nil {
				return err
			}
			r, err := readRecord(tx, string(k))
			if err != nil {
				return err
			}
			roots = s.appendRecordRefs(roots, r, tx.Bucket(bktFreed).Get(k) != nil)
			return nil
		})
		if err != nil {
			return err
		}
		roots = appendRoots(roots, tx)
		if roots, err = appendOwed(roots, tx); err != nil {
			return err
		}
		if roots, err = appendLedgerRoots(roots, tx); err != nil {
			return err
		}
		live, err = expandRefs(tx, roots)
		return err
	})
	return live, err
}

// appendRoots appends the objects kept as roots ([Store.AddRoot]).
func appendRoots(dst []record.Address, tx *bolt.Tx) []record.Address {
	_ = tx.Bucket(bktRoots).ForEach(func(k, _ []byte) error {
		if len(k) == 32 {
			dst = append(dst, record.Address(k))
		}
		return nil
	})
	return dst
}

// expandRefs closes roots under declared refs.
func expandRefs(tx *bolt.Tx, roots []record.Address) (map[record.Address]bool, error) {
	live := make(map[record.Address]bool, len(roots))
	stack := make([]record.Address, 0, len(roots))
	for _, a := range roots {
		if !live[a] {
			live[a] = true
			stack = append(stack, a)
		}
	}
	for len(stack) > 0 {
		a := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		refs, err := getRefs(tx, a)
		if err != nil {
			return nil, err
		}
		for _, r := range refs {
			if !live[r] {
				live[r] = true
				stack = append(stack, r)
			}
		}
	}
	return live, nil
}

// walkObjects calls fn for every object file. Anything in objects/ that
// is not an object, a shard directory or tmp/ is [ErrDamaged]: nothing
// else is put there, so something else means the directory was tampered
// with or damaged.
func (s *Store) walkObjects(fn func(a record.Address, p string, info os.FileInfo) error) error {
	shards, err := os.ReadDir(s.objects)
	if err != nil {
		return fmt.Errorf("store %s: %w: %v", s.dir, ErrDamaged, err)
	}
	for _, sh := range shards {
		name := sh.Name()
		if name == "tmp" {
			continue
		}
		if !sh.IsDir() || len(name) != 1 || !strings.Contains(shardChars, name) {
			return fmt.Errorf("store %s: %w: objects/%s is not a shard directory", s.dir, ErrDamaged, name)
		}
		files, err := os.ReadDir(filepath.Join(s.objects, name))
		if err != nil {
			return fmt.Errorf("store %s: %w: %v", s.dir, ErrDamaged, err)
		}
		for _, f := range files {
			a, err := record.ParseAddress(record.AddressPrefix + f.Name())
			if err != nil || !strings.HasPrefix(f.Name(), name) || !f.Type().IsRegular() {
				return fmt.Errorf("store %s: %w: objects/%s/%s is not an object", s.dir, ErrDamaged, name, f.Name())
			}
			info, err := f.Info()
			if err != nil {
				return fmt.Errorf("store %s: %w", s.dir, err)
			}
			if err := fn(a, filepath.Join(s.objects, name, f.Name()), info); err != nil {
				return err
			}
		}
	}
	return nil
}

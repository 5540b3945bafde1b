package store

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Post-copy migration (docs/notes/post-copy-design.md). On the target, a
// run is stored before every slab of its last snapshot's memory image is
// here: those slabs are **owed**, brought in from the source behind the
// unit. On the source, the handed-off run's objects are **held** for the
// target until it says it holds them all.
//
// An owed run's listings that name an owed slab declare every ref but the
// owed ones (a declared ref must be stored); [Store.Settle] declares the
// settled slab at once. A collection keeps every owed slab a run's owing
// names, so one adopted and not yet settled is never taken, and a
// settled one is reachable from its listings.

// ErrOwed: the run lacks objects a post-copy migration still owes it; what
// needs every object of the run (an export, a migration onward) waits.
var ErrOwed = errors.New("the run still lacks slabs a post-copy migration owes it")

// ErrStranded: a run whose owing is stranded ([Store.Strand]): its source
// can serve the owed slabs no more, and nothing fetches them. It comes
// with [ErrOwed].
var ErrStranded = errors.New("its post-copy source can serve the owed slabs no more (stranded): close the run")

// Owing is what a run lacks of its last snapshot, and where it comes from.
type Owing struct {
	// Source is the key id of the host that serves the slabs, and Head
	// the head it handed the run over at.
	Source, Head record.Address
	// Slabs are the slabs not held yet.
	Slabs []record.Address
	// Listings are the listings that name a slab (owed now or when the
	// run was stored), whose refs [Store.Settle] completes.
	Listings []record.Address
}

// maxOwing bounds an owing's slabs and listings: far past a memory
// image's (MaxSlabs per pages file, a pages file per process).
const maxOwing = 1 << 16

// encode: format 1 ‖ source (32) ‖ head (32) ‖ slab count (4) ‖ slabs
// (32 each) ‖ listing count (4) ‖ listings (32 each).
func (o Owing) encode() []byte {
	b := append([]byte{1}, o.Source[:]...)
	b = append(b, o.Head[:]...)
	b = binary.BigEndian.AppendUint32(b, uint32(len(o.Slabs)))
	for _, a := range o.Slabs {
		b = append(b, a[:]...)
	}
	b = binary.BigEndian.AppendUint32(b, uint32(len(o.Listings)))
	for _, a := range o.Listings {
		b = append(b, a[:]...)
	}
	return b
}

func decodeOwing(v []byte) (Owing, error) {
	bad := fmt.Errorf("%w: an owing of %d bytes", ErrDamaged, len(v))
	if len(v) < 1+64+8 || v[0] != 1 {
		return Owing{}, bad
	}
	o := Owing{Source: record.Address(v[1:33]), Head: record.Address(v[33:65])}
	p := v[65:]
	list := func() ([]record.Address, bool) {
		if len(p) < 4 {
			return nil, false
		}
		n := int(binary.BigEndian.Uint32(p))
		p = p[4:]
		if n > maxOwing || len(p) < 32*n {
			return nil, false
		}
		out := make([]record.Address, n)
		for i := range out {
			out[i] = record.Address(p[32*i:])
		}
		p = p[32*n:]
		return out, true
	}
	var ok1, ok2 bool
	o.Slabs, ok1 = list()
	o.Listings, ok2 = list()
	if !ok1 || !ok2 || len(p) != 0 {
		return Owing{}, bad
	}
	return o, nil
}

func (o Owing) check() error {
	if len(o.Slabs) == 0 || len(o.Slabs) > maxOwing || len(o.Listings) > maxOwing {
		return fmt.Errorf("store: an owing of %d slabs and %d listings", len(o.Slabs), len(o.Listings))
	}
	return nil
}

// ImportOwing is [Store.ImportAs] for a run some of whose slabs are owed:
// the owing is stored in the import's transaction. Every object the run's
// segments name must be stored (the listings among them), not the owed
// slabs.
func (s *Store) ImportOwing(run string, r *record.Record, copy bool, o Owing) error {
	if err := o.check(); err != nil {
		return err
	}
	return s.importAs(run, r, copy, &o)
}

// Owed returns what run still lacks; ok is false when no post-copy
// migration of it is under way. An owing with no slabs left is one whose
// source was not told yet ([Store.Discharge]).
func (s *Store) Owed(run string) (o Owing, ok bool, err error) {
	err = s.view(func(tx *bolt.Tx) error {
		v := tx.Bucket(bktOwed).Get([]byte(run))
		if v == nil {
			return nil
		}
		ok = true
		o, err = decodeOwing(v)
		return err
	})
	return o, ok, err
}

// OwedRuns are the runs that lack slabs, by id.
func (s *Store) OwedRuns() ([]string, error) {
	var out []string
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bktOwed).ForEach(func(k, _ []byte) error {
			out = append(out, string(k))
			return nil
		})
	})
	return out, err
}

// OwedBytes are the bytes of the slabs runs owe (each once) that the store
// lacks yet: room its filesystem must still take for them. A stranded
// owing's are left out.
func (s *Store) OwedBytes() (uint64, error) {
	var owings []Owing
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bktOwed).ForEach(func(k, v []byte) error {
			o, err := decodeOwing(v)
			if err != nil {
				return fmt.Errorf("run %s: %w", k, err)
			}
			if _, stranded, err := strandOf(tx, string(k), o); err != nil || stranded {
				return err // a stranded owing's slabs never come
			}
			owings = append(owings, o)
			return nil
		})
	})
	if err != nil {
		return 0, err
	}
	var n uint64
	seen := map[record.Address]bool{}
	for _, o := range owings {
		for _, l := range o.Listings {
			es, err := s.Listing(l)
			if err != nil {
				return 0, err
			}
			for _, e := range es {
				if !seen[e.Address] && slices.Contains(o.Slabs, e.Address) && !s.Has(e.Address) {
					seen[e.Address] = true
					n += e.Size
				}
			}
		}
	}
	return n, nil
}

// Settle records that run holds owed slab, which must be stored (adopted
// by its bringer): each of the run's listings naming it declares it as a
// ref at once (a put adds refs), so the slab is reachable from the run
// before it leaves the owing, even while another slab of the listing is
// still owed; a listing all of whose files are then stored declares its
// refs in full. A slab the run does not owe is a no-op; a crash part way
// leaves it owed, and settling it again finishes.
func (s *Store) Settle(ctx context.Context, run string, slab record.Address) error {
	o, ok, err := s.Owed(run)
	if err != nil || !ok || !slices.Contains(o.Slabs, slab) {
		return err
	}
	if !s.Has(slab) {
		return fmt.Errorf("run %s: slab %s: %w", run, slab, ErrMissingObject)
	}
	left := slices.DeleteFunc(slices.Clone(o.Slabs), func(a record.Address) bool { return a == slab })
	for _, l := range o.Listings {
		if err := ctx.Err(); err != nil {
			return err
		}
		b, err := s.ReadAll(l)
		if err != nil {
			return err
		}
		es, err := DecodeListing(b)
		if err != nil {
			return err
		}
		// Every entry not owed is stored: the run's own, or settled.
		refs := make([]record.Address, 0, len(es))
		names, whole := false, true
		for _, e := range es {
			names = names || e.Address == slab
			switch {
			case slices.Contains(left, e.Address):
				whole = false
			case !slices.Contains(refs, e.Address):
				refs = append(refs, e.Address)
			}
		}
		if !names && !whole {
			continue
		}
		if _, err := s.PutBytes(b, refs...); err != nil {
			return fmt.Errorf("run %s: listing %s: %w", run, l, err)
		}
	}
	return s.commit(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bktOwed)
		v := bk.Get([]byte(run))
		if v == nil {
			return nil
		}
		cur, err := decodeOwing(v)
		if err != nil {
			return refuse(err)
		}
		cur.Slabs = slices.DeleteFunc(cur.Slabs, func(a record.Address) bool { return a == slab })
		return bk.Put([]byte(run), cur.encode())
	})
}

// Owes says whether run lacks slabs ([ErrOwed] when it does, with
// [ErrStranded] and its reason when its owing is stranded).
func (s *Store) Owes(run string) error {
	o, ok, err := s.Owed(run)
	if err != nil || !ok || len(o.Slabs) == 0 {
		return err
	}
	sd, stranded, err := s.StrandOf(run)
	if err != nil {
		return err
	}
	if stranded {
		return fmt.Errorf("run %s: %w: %d slabs from host %s: %w: %s", run, ErrOwed, len(o.Slabs), o.Source, ErrStranded, sd.Reason)
	}
	return fmt.Errorf("run %s: %w: %d slabs from host %s", run, ErrOwed, len(o.Slabs), o.Source)
}

// Discharge ends run's owing once it lacks nothing and its source was
// told; an owing with slabs left is refused ([ErrOwed]), and a run
// owing nothing is a no-op.
func (s *Store) Discharge(run string) error {
	return s.commit(func(tx *bolt.Tx) error {
		bk := tx.Bucket(bktOwed)
		v := bk.Get([]byte(run))
		if v == nil {
			return nil
		}
		o, err := decodeOwing(v)
		if err != nil {
			return refuse(err)
		}
		if len(o.Slabs) > 0 {
			return refuse(fmt.Errorf("run %s: %w: %d slabs", run, ErrOwed, len(o.Slabs)))
		}
		if err := dropStrand(tx, run); err != nil {
			return err
		}
		return bk.Delete([]byte(run))
	})
}

// Abandon ends run's owing whatever it lacks, stranded or not: the run is
// held elsewhere now (handed back, or never claimed here) or closed, and
// its owed slabs are not brought in.
func (s *Store) Abandon(run string) error {
	return s.commit(func(tx *bolt.Tx) error {
		if err := dropStrand(tx, run); err != nil {
			return err
		}
		return tx.Bucket(bktOwed).Delete([]byte(run))
	})
}

// Strand is why a run's owing is stranded, and since when: its source can
// serve the owed slabs no more (it holds the run no more, or its bytes
// never hash to their addresses).
type Strand struct {
	Reason string
	Since  time.Time
}

// maxStrandReason bounds a strand's reason, in bytes.
const maxStrandReason = 1 << 10

// encode: format 1 ‖ the owing's head (32) ‖ since (8, Unix ns) ‖ reason.
func (sd Strand) encode(head record.Address) []byte {
	b := append([]byte{1}, head[:]...)
	b = binary.BigEndian.AppendUint64(b, uint64(sd.Since.UnixNano()))
	return append(b, sd.Reason...)
}

func decodeStrand(run string, v []byte) (record.Address, Strand, error) {
	if len(v) < 1+32+8 || len(v) > 1+32+8+maxStrandReason || v[0] != 1 {
		return record.Address{}, Strand{}, fmt.Errorf("run %s: %w: a strand of %d bytes", run, ErrDamaged, len(v))
	}
	since, _ := decodeNS(v[33:41])
	return record.Address(v[1:33]), Strand{Reason: string(v[41:]), Since: since}, nil
}

// Strand marks run's owing stranded for reason: nothing is to fetch its
// slabs again, [Store.Owes] says [ErrStranded], and its owing ends only
// with the run's close (or the run handed elsewhere: [Store.Abandon]).
// The owing itself is unchanged. A run owing nothing is a no-op; a
// stranded owing keeps its first reason.
func (s *Store) Strand(run, reason string) error {
	if len(reason) > maxStrandReason {
		reason = strings.ToValidUTF8(reason[:maxStrandReason], "")
	}
	return s.commit(func(tx *bolt.Tx) error {
		v := tx.Bucket(bktOwed).Get([]byte(run))
		if v == nil {
			return nil
		}
		o, err := decodeOwing(v)
		if err != nil {
			return refuse(err)
		}
		if _, ok, err := strandOf(tx, run, o); err != nil || ok {
			return err
		}
		bk, err := tx.CreateBucketIfNotExists(bktStrand)
		if err != nil {
			return err
		}
		return bk.Put([]byte(run), Strand{Reason: reason, Since: time.Now()}.encode(o.Head))
	})
}

// StrandOf is why run's owing is stranded; ok is false when it owes
// nothing or is not stranded.
func (s *Store) StrandOf(run string) (sd Strand, ok bool, err error) {
	err = s.view(func(tx *bolt.Tx) error {
		v := tx.Bucket(bktOwed).Get([]byte(run))
		if v == nil {
			return nil
		}
		o, err := decodeOwing(v)
		if err != nil {
			return err
		}
		sd, ok, err = strandOf(tx, run, o)
		return err
	})
	return sd, ok, err
}

// strandOf is run's strand in tx, if its owing o is stranded: a mark made
// for another owing of the run (another head: left by an older daemon,
// which does not know the mark) is not o's.
func strandOf(tx *bolt.Tx, run string, o Owing) (Strand, bool, error) {
	bk := tx.Bucket(bktStrand)
	if bk == nil {
		return Strand{}, false, nil
	}
	v := bk.Get([]byte(run))
	if v == nil {
		return Strand{}, false, nil
	}
	head, sd, err := decodeStrand(run, v)
	if err != nil || head != o.Head {
		return Strand{}, false, err
	}
	return sd, true, nil
}

// dropStrand ends run's strand mark, if any, with its owing.
func dropStrand(tx *bolt.Tx, run string) error {
	if bk := tx.Bucket(bktStrand); bk != nil {
		return bk.Delete([]byte(run))
	}
	return nil
}

// appendOwed appends every slab an owing names: a collection keeps them.
func appendOwed(dst []record.Address, tx *bolt.Tx) ([]record.Address, error) {
	err := tx.Bucket(bktOwed).ForEach(func(k, v []byte) error {
		o, err := decodeOwing(v)
		if err != nil {
			return fmt.Errorf("run %s: %w", k, err)
		}
		dst = append(dst, o.Slabs...)
		return nil
	})
	return dst, err
}

// Hold is a source's promise to serve a handed-off run's objects to the
// host it handed the run to, until that host says it holds them all.
type Hold struct {
	Run    string
	Target record.Address // the key id of the host the run went to
	Head   record.Address // the head the run was handed off at
	Since  time.Time      // made, or renewed by its target's last read ([Store.RenewHold])
}

// encode: format 1 ‖ target (32) ‖ head (32) ‖ since (8, Unix ns).
func (h Hold) encode() []byte {
	b := append([]byte{1}, h.Target[:]...)
	b = append(b, h.Head[:]...)
	return binary.BigEndian.AppendUint64(b, uint64(h.Since.UnixNano()))
}

func decodeHold(run string, v []byte) (Hold, error) {
	if len(v) != 1+32+32+8 || v[0] != 1 {
		return Hold{}, fmt.Errorf("run %s: %w: a hold of %d bytes", run, ErrDamaged, len(v))
	}
	since, _ := decodeNS(v[65:])
	return Hold{Run: run, Target: record.Address(v[1:33]), Head: record.Address(v[33:65]), Since: since}, nil
}

// AddHold keeps run's objects for h.Target: retention does not release the
// run's snapshots while it is held ([Store.Release], [Store.Expired]). A
// run holds one hold: a new one replaces it. The hold ends with
// [Store.DropHold], or when the run is this host's again
// ([Store.Reclaim], [Store.TakeOver], [Store.Extend]).
func (s *Store) AddHold(run string, target, head record.Address) error {
	h := Hold{Run: run, Target: target, Head: head, Since: time.Now()}
	return s.commit(func(tx *bolt.Tx) error {
		if _, err := getState(tx, run); err != nil {
			return refuse(err)
		}
		return tx.Bucket(bktHolds).Put([]byte(run), h.encode())
	})
}

// DropHold ends run's hold if it is target's at head, and says whether it
// did.
func (s *Store) DropHold(run string, target, head record.Address) (bool, error) {
	dropped := false
	err := s.commit(func(tx *bolt.Tx) error {
		_, ok, err := holdAt(tx, run, target, head)
		if err != nil || !ok {
			return err
		}
		dropped = true
		return tx.Bucket(bktHolds).Delete([]byte(run))
	})
	return dropped, err
}

// holdAt is run's hold in tx, and whether it is target's at head.
func holdAt(tx *bolt.Tx, run string, target, head record.Address) (Hold, bool, error) {
	v := tx.Bucket(bktHolds).Get([]byte(run))
	if v == nil {
		return Hold{}, false, nil
	}
	h, err := decodeHold(run, v)
	if err != nil {
		return Hold{}, false, refuse(err)
	}
	return h, h.Target == target && h.Head == head, nil
}

// RenewHold restarts run's hold's life at at, its target's last read of
// it (Hold.Since becomes at), if the hold is target's at head and at is
// after its Since; it says whether it did.
func (s *Store) RenewHold(run string, target, head record.Address, at time.Time) (bool, error) {
	renewed := false
	err := s.commit(func(tx *bolt.Tx) error {
		h, ok, err := holdAt(tx, run, target, head)
		if err != nil || !ok || !at.After(h.Since) {
			return err
		}
		h.Since, renewed = at, true
		return tx.Bucket(bktHolds).Put([]byte(run), h.encode())
	})
	return renewed, err
}

// endHold ends run's hold, if any: the run is this host's again
// (reclaimed, taken over, or arrived here), so no target holds it from
// here.
func endHold(tx *bolt.Tx, run string) error {
	return tx.Bucket(bktHolds).Delete([]byte(run))
}

// Holds are the runs held for their targets.
func (s *Store) Holds() ([]Hold, error) {
	var out []Hold
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bktHolds).ForEach(func(k, v []byte) error {
			h, err := decodeHold(string(k), v)
			if err == nil {
				out = append(out, h)
			}
			return err
		})
	})
	return out, err
}

// HoldOf is run's hold, if it has one.
func (s *Store) HoldOf(run string) (h Hold, ok bool, err error) {
	err = s.view(func(tx *bolt.Tx) error {
		v := tx.Bucket(bktHolds).Get([]byte(run))
		if v == nil {
			return nil
		}
		ok = true
		h, err = decodeHold(run, v)
		return err
	})
	return h, ok, err
}

// migratePostCopy (6 → 7) adds the owed and holds buckets, empty.
func migratePostCopy(tx *bolt.Tx) error {
	for _, b := range [][]byte{bktOwed, bktHolds} {
		if _, err := tx.CreateBucket(b); err != nil {
			return err
		}
	}
	return nil
}

package transfer

import (
	"context"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Fetched is what a [Stage] brought in: objects staged and verified, not
// adopted. It is a store as bundle.ImportStored judges one — the objects
// staged and those the store holds, read verified — and it adopts what it
// staged only when the run is stored ([Fetched.ImportAs],
// [Fetched.Extend]: each after its refs), once every check passed. Close
// it: what was not adopted goes.
type Fetched struct {
	*store.Store
	ctx    context.Context
	dir    string
	staged map[record.Address]*staged
	order  []record.Address
	// declared are refs to declare on objects the store held, kept until
	// the staged objects they may name are adopted.
	declared []declare
	adopted  bool
	early    early
	// owing is what a post-copy fetch left owed (Options.Owe), owed its
	// slabs with their chunks.
	owing store.Owing
	owed  []OwedSlab
	// rehashed are objects the store held for the run that the fetch
	// rehashed to their addresses, each with when (rehasher).
	rehashed map[record.Address]time.Time
}

type staged struct {
	path string
	size int64
	refs []record.Address
}

type declare struct {
	b    []byte
	refs []record.Address
}

var _ bundle.Holding = (*Fetched)(nil)

func (f *Fetched) add(a record.Address, p string, n int64, refs []record.Address) {
	f.staged[a] = &staged{path: p, size: n, refs: refs}
	f.order = append(f.order, a)
	f.early.add(p)
}

// Staged is how many objects are staged, and their bytes.
func (f *Fetched) Staged() (int, int64) {
	var n int64
	for _, s := range f.staged {
		n += s.size
	}
	return len(f.staged), n
}

// Has says whether a is staged or held.
func (f *Fetched) Has(a record.Address) bool {
	_, ok := f.staged[a]
	return ok || f.Store.Has(a)
}

// Size is a staged object's size, an owed slab's listed size, or the
// store's.
func (f *Fetched) Size(a record.Address) (int64, error) {
	if s, ok := f.staged[a]; ok {
		return s.size, nil
	}
	for _, o := range f.owed {
		if o.Slab.Address == a {
			return int64(o.Slab.Size), nil
		}
	}
	return f.Store.Size(a)
}

// Open reads a staged object, or the store's, verified.
func (f *Fetched) Open(a record.Address) (*store.Reader, error) {
	if s, ok := f.staged[a]; ok {
		return store.OpenFile(s.path, a)
	}
	return f.Store.Open(a)
}

// Refs are a staged object's refs, or the store's.
func (f *Fetched) Refs(a record.Address) ([]record.Address, error) {
	if s, ok := f.staged[a]; ok {
		return slices.Clone(s.refs), nil
	}
	return f.Store.Refs(a)
}

// VerifiedOnArrival says whether a is staged: its bytes were hashed to a
// in this process as they were written to staging, and nothing writes
// them since, so neither bundle.ImportStored nor the adoption
// (store.Adoption.Hashed) reads them again (bundle.VerifiedOnArrival). An
// object the store held is not.
func (f *Fetched) VerifiedOnArrival(a record.Address) bool {
	_, ok := f.staged[a]
	return ok
}

var _ bundle.VerifiedOnArrival = (*Fetched)(nil)

// Rehashed says whether a is an object the store held for the run (one
// this host's own record of it reaches, which the fetched record
// extends) that this process rehashed to a, while the fetch brought the
// rest or ahead of it (Options.Rehashed), less than RehashedFor ago
// (bundle.Rehashed). One that did not hash to a is not.
func (f *Fetched) Rehashed(a record.Address) bool {
	at, ok := f.rehashed[a]
	return ok && time.Since(at) < RehashedFor
}

var _ bundle.Rehashed = (*Fetched)(nil)

// PutBytes adds refs to an object staged or held, whose bytes are b: a
// staged one's are kept for its adoption, a held one's declared after the
// staged objects are adopted. Any other object is not the fetch's to
// write.
func (f *Fetched) PutBytes(b []byte, refs ...record.Address) (record.Address, error) {
	a := record.Sum(b)
	if s, ok := f.staged[a]; ok {
		for _, r := range refs {
			if !slices.Contains(s.refs, r) {
				s.refs = append(s.refs, r)
			}
		}
		return a, nil
	}
	if !f.Store.Has(a) {
		return record.Address{}, fmt.Errorf("transfer: object %s: %w: neither staged nor held", a, store.ErrMissingObject)
	}
	f.declared = append(f.declared, declare{b: b, refs: refs})
	return a, nil
}

// ImportAs adopts the staged objects, then stores the run, owing what
// the fetch left owed ([store.Store.ImportOwing]).
func (f *Fetched) ImportAs(id string, r *record.Record, copy bool) error {
	if err := f.AdoptAll(f.ctx); err != nil {
		return err
	}
	if len(f.owing.Slabs) > 0 {
		return f.Store.ImportOwing(id, r, copy, f.owing)
	}
	return f.Store.ImportAs(id, r, copy)
}

// Extend adopts the staged objects, then extends the run. A fetch that
// owes is never an extension (Options.Owe).
func (f *Fetched) Extend(id string, r *record.Record, copy, reclaim bool) (record.Address, error) {
	if len(f.owing.Slabs) > 0 {
		return record.Address{}, fmt.Errorf("transfer: run %s: an extension of a run held here is fetched whole, not owed", id)
	}
	if err := f.AdoptAll(f.ctx); err != nil {
		return record.Address{}, err
	}
	return f.Store.Extend(id, r, copy, reclaim)
}

// AdoptAll moves every staged object into the store, each after its refs,
// made durable together ([store.Store.AdoptFiles]: when it returns, a
// record naming them can be stored), then declares the refs kept for held
// objects. Once is enough: a second call does nothing.
func (f *Fetched) AdoptAll(ctx context.Context) error {
	if f.adopted {
		return nil
	}
	as := make([]store.Adoption, 0, len(f.staged))
	done := map[record.Address]bool{}
	var order func(a record.Address)
	order = func(a record.Address) {
		s, ok := f.staged[a]
		if !ok || done[a] {
			return
		}
		done[a] = true
		for _, r := range s.refs {
			order(r)
		}
		as = append(as, store.Adoption{Path: s.path, Address: a, Refs: s.refs, Hashed: &store.Hashed{Size: s.size, Address: a}})
	}
	for _, a := range f.order {
		order(a)
	}
	f.early.stop()
	if err := f.Store.AdoptFiles(ctx, as); err != nil {
		return fmt.Errorf("transfer: %w", err)
	}
	for _, d := range f.declared {
		if _, err := f.Store.PutBytes(d.b, d.refs...); err != nil {
			return err
		}
	}
	f.adopted = true
	return nil
}

// Close removes what was staged and not adopted.
func (f *Fetched) Close() error {
	f.early.stop()
	return os.RemoveAll(f.dir)
}

package transfer

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/park"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Errors. A refused fetch wraps one of these, or a [*store.CorruptError]
// (bytes that do not hash to the address asked for; errors.Is
// [store.ErrCorrupt]); test with errors.Is.
var (
	// ErrAbsent: the peer does not hold an object the record reaches (404).
	ErrAbsent = errors.New("the peer does not hold the object")
	// ErrTruncated: a body that ended before the bytes it declared.
	ErrTruncated = errors.New("object truncated")
	// ErrLimit: an object, a decoded document or a fetch over its
	// [bundle.Limits] cap. It wraps bundle.ErrLimit: a fetch is refused
	// as a bundle is.
	ErrLimit = fmt.Errorf("over a transfer limit: %w", bundle.ErrLimit)
	// ErrNoSpace: the fetch would leave the store's filesystem with less
	// than its minimum free space (Options.Free). It wraps park.ErrNoSpace.
	ErrNoSpace = fmt.Errorf("the fetch does not fit: %w", park.ErrNoSpace)
	// ErrMalformed: an object whose bytes are not what the record says
	// they are: an attestation that does not open, a listing that does not
	// decode, a file of another size than its listing says.
	ErrMalformed = errors.New("malformed object")
	// ErrPeer: an answer this package does not read: another status, a
	// body without a Content-Length, a response that does not decode.
	ErrPeer = errors.New("unexpected answer from the peer")
)

// Options are what [Fetch] holds a peer to.
type Options struct {
	// Limits cap one object (Object), all bytes fetched (Total), an
	// object read whole to be decoded, an attestation or a listing
	// (JSON), and the objects the record reaches, held or fetched
	// (Objects); zero fields are [bundle.DefaultLimits]'. An import holds
	// a bundle to the same.
	Limits bundle.Limits
	// Free, when not nil, says how many bytes the store's filesystem can
	// still take beyond its minimum free space (park.Free, serve
	// --min-free); it is asked once, and the fetch's bytes are held to it
	// (ErrNoSpace).
	Free func() (uint64, error)
	// Owe, for a post-copy migration, is the key id of the source: the
	// slabs of the last snapshot's memory image are not fetched but owed
	// ([Fetched.Owed]), brought in behind the resumed unit ([Owed]). Not
	// for a run the store holds a record of (it is fetched whole). Zero:
	// every object is fetched.
	Owe record.Address
	// Rehashed, when not nil, says which objects the store holds this
	// process rehashed to their addresses before the fetch, and when
	// (RehashHeld, ahead of a migration): one held for the run that it
	// names is [Fetched.Rehashed] without being read again, while it is
	// under RehashedFor old.
	Rehashed func(a record.Address) (at time.Time, ok bool)
}

// Source is the peer a fetch reads objects from: its [Handler] at Base,
// asked through Client.
type Source struct {
	Client *http.Client
	Base   string
}

// Stats count what a [Fetch] did.
type Stats struct {
	Objects int   // objects fetched
	Bytes   int64 // their bytes
	Skipped int   // objects the store held already for the run ([Stage])
}

// kind is what the record says an object is, which decides its refs.
type kind int

const (
	plain       kind = iota // no refs: unit, grants, manifest, transcript, receipt, journal, a listed file
	attestation             // refs: its receipt and journal
	listing                 // refs: its files
)

// fetcher is one Stage under way.
type fetcher struct {
	ctx   context.Context
	c     *http.Client
	base  string
	st    *store.Store
	ours  map[record.Address]bool // what the run's record held here reaches
	lim   bundle.Limits
	room  int64                   // the bytes the store may take, or -1
	done  map[record.Address]kind // objects dealt with, as what
	taken int64                   // bytes the peer was asked for, held to the Total limit
	buf   []byte                  // the copy buffer
	// owe are the slabs owed (Options.Owe), by address; pre the last
	// memory listing's bytes, read to find them.
	owe   map[record.Address]store.Entry
	pre   map[record.Address][]byte
	out   *Fetched
	stats Stats

	// rehash rehashes the plain objects held for the run as the walk
	// finds them (nil: none are).
	rehash *rehasher
}

// Fetch brings into st every object rec reaches that st lacks, from the
// peer at from: [Stage], then [Fetched.AdoptAll] once every
// object is staged and verified. A refused fetch adopts nothing: st is as
// it was.
//
// Fetch does not judge the record: [Stage] is for a caller that judges it
// (bundle.ImportStored over the [Fetched]) before anything is adopted.
func Fetch(ctx context.Context, from Source, st *store.Store, rec *record.Record, opt Options) (Stats, error) {
	f, s, err := Stage(ctx, from, st, rec, opt)
	if err != nil {
		return s, err
	}
	defer f.Close()
	return s, f.AdoptAll(ctx)
}

// Stage brings into a staging directory of st every object rec reaches
// that st lacks, from the peer at from: the objects
// [bundle.Reached] lists for an export, in its order — each object after
// the objects it refers to — each with the refs its own bytes give, as an
// import judges them: an attestation's receipt and journal (attest.Open),
// a listing's files ([store.DecodeListing], each of the size listed). An
// object st holds for the run is not fetched — one that a record of rec's
// genesis held here, which rec extends, reaches ([bundle.Reached]); every
// other object is fetched, held or not: knowing an address is not holding
// its bytes. An attestation or listing held for the run is read
// (verified) for its refs, which are fetched unless held for the run.
//
// Every object is streamed into staging with at most the bytes its
// Content-Length declares and the limits and the room allow, and hashed
// on the way: kept only if it hashes to the address asked for. The
// objects rec reaches, held or not, are at most Limits.Objects. Nothing is
// adopted: the [Fetched] is the objects staged, which a caller judges
// (it is a bundle.Holding) and adopts ([Fetched.AdoptAll]), or lets go
// ([Fetched.Close]). On a refusal nothing is left staged and st is as it
// was.
func Stage(ctx context.Context, from Source, st *store.Store, rec *record.Record, opt Options) (_ *Fetched, _ Stats, err error) {
	f := &fetcher{ctx: ctx, c: from.Client, base: from.Base, st: st, lim: opt.Limits.Or(bundle.DefaultLimits), room: -1, done: map[record.Address]kind{}}
	if opt.Free != nil {
		free, err := opt.Free()
		if err != nil {
			return nil, Stats{}, fmt.Errorf("transfer: %w", err)
		}
		f.room = int64(min(free, 1<<62))
	}
	if f.ours, err = ours(st, rec); err != nil {
		return nil, Stats{}, err
	}
	dir, err := st.StagingDir("fetch")
	if err != nil {
		return nil, Stats{}, err
	}
	f.out = &Fetched{Store: st, ctx: ctx, dir: dir, staged: map[record.Address]*staged{}}
	if f.ours != nil {
		f.rehash = newRehasher(ctx, st, opt.Rehashed)
	}
	defer func() {
		if err != nil {
			if f.rehash != nil {
				f.rehash.stop()
			}
			f.out.Close()
		}
	}()
	if !opt.Owe.IsZero() && f.ours == nil {
		if err := f.findOwed(rec, opt.Owe); err != nil {
			return nil, f.stats, err
		}
	}
	for _, r := range roots(rec) {
		if err := f.object(r.addr, r.kind, -1); err != nil {
			return nil, f.stats, err
		}
	}
	if err := f.owedChunks(rec); err != nil {
		return nil, f.stats, err
	}
	if f.rehash != nil {
		f.out.rehashed = f.rehash.wait()
	}
	return f.out, f.stats, nil
}

// ours returns the objects st holds for rec's run: those the record of
// rec's genesis held in st reaches, if rec extends it; else none.
func ours(st *store.Store, rec *record.Record) (map[record.Address]bool, error) {
	run, ok, err := st.RunOfGenesis(rec.Genesis())
	if err != nil || !ok {
		return nil, err
	}
	h, err := st.Record(run)
	if err != nil {
		return nil, err
	}
	if n := h.Len(); n > rec.Len() || n > 0 && rec.HeadAt(n-1) != h.Head() {
		return nil, nil
	}
	objs, err := bundle.Reached(st, h, true)
	if err != nil {
		return nil, err
	}
	out := make(map[record.Address]bool, len(objs))
	for _, a := range objs {
		out[a] = true
	}
	return out, nil
}

// held says whether st holds a for the run: a is then not fetched.
func (f *fetcher) held(a record.Address) bool { return f.ours[a] && f.st.Has(a) }

type root struct {
	addr record.Address
	kind kind
}

// roots are the objects the record names, in [bundle.Reached]'s order,
// each with what the record says it is.
func roots(rec *record.Record) []root {
	out := []root{{rec.Unit(), plain}, {rec.Grants(), plain}}
	for i := range rec.Len() {
		s := rec.Segment(i)
		switch s.Kind {
		case record.Executed:
			out = append(out, root{s.Attestation, attestation})
		case record.Suspended:
			out = append(out, root{s.Manifest, plain})
			k := listing
			if s.Snapshot.IsTranscript() {
				k = plain
			}
			for _, a := range s.Snapshot.Addresses() {
				out = append(out, root{a, k})
			}
		}
	}
	return out
}

// object makes sure st holds a as k, or stages it, after its refs. size
// is the size a listing gives a file, or -1.
func (f *fetcher) object(a record.Address, k kind, size int64) error {
	prev, ok := f.done[a]
	if ok && (prev == k || k == plain) {
		return nil
	}
	if !ok && len(f.done) >= f.lim.Objects {
		return fmt.Errorf("transfer: %w: the record reaches more than %d objects", ErrLimit, f.lim.Objects)
	}
	f.done[a] = k
	if k == plain {
		return f.plain(a, size)
	}
	b, held, err := f.document(a)
	if err != nil {
		return err
	}
	refs, err := f.refs(a, k, b)
	if err != nil {
		return err
	}
	if held {
		return f.keepRefs(a, b, refs)
	}
	if s, ok := f.out.staged[a]; ok {
		// Staged first as a plain object (a file that is also a
		// listing): it declares refs now.
		s.refs = refs
		return nil
	}
	return f.stageBytes(a, b, refs)
}

// refs reads what a's bytes refer to and brings each into st first.
func (f *fetcher) refs(a record.Address, k kind, b []byte) ([]record.Address, error) {
	if k == attestation {
		body, err := attest.Open(b, nil)
		if err != nil {
			return nil, fmt.Errorf("transfer: attestation %s: %w: %w", a, ErrMalformed, err)
		}
		refs := []record.Address{body.Receipt, body.Journal}
		for _, r := range refs {
			if err := f.object(r, plain, -1); err != nil {
				return nil, err
			}
		}
		return refs, nil
	}
	es, err := store.DecodeListing(b)
	if err != nil {
		return nil, fmt.Errorf("transfer: listing %s: %w: %w", a, ErrMalformed, err)
	}
	refs := make([]record.Address, 0, len(es))
	for _, e := range es {
		if e.Size > uint64(f.lim.Object) {
			return nil, fmt.Errorf("transfer: listing %s: %w: %q of %d bytes, the object limit is %d", a, ErrLimit, e.Name, e.Size, f.lim.Object)
		}
		if owed, err := f.owes(a, e); owed || err != nil {
			if err != nil {
				return nil, fmt.Errorf("transfer: listing %s: %q: %w", a, e.Name, err)
			}
			continue
		}
		if err := f.object(e.Address, plain, int64(e.Size)); err != nil {
			return nil, fmt.Errorf("transfer: listing %s: %q: %w", a, e.Name, err)
		}
		refs = append(refs, e.Address)
	}
	return refs, nil
}

// keepRefs makes sure an object st held declares refs when the fetch is
// adopted: a put of its bytes then adds to its refs what they lack.
func (f *fetcher) keepRefs(a record.Address, b []byte, refs []record.Address) error {
	have, err := f.st.Refs(a)
	if err != nil {
		return err
	}
	for _, r := range refs {
		if !slices.Contains(have, r) {
			f.out.declared = append(f.out.declared, declare{b: b, refs: refs})
			return nil
		}
	}
	return nil
}

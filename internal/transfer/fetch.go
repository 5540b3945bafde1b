package transfer

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"

	"github.com/runrecordd/runrecordd/internal/bundle"
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
	// [bundle.Limits] cap.
	ErrLimit = errors.New("over a transfer limit")
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
	// Limits cap one object (Object), all bytes fetched (Total) and an
	// object read whole to be decoded, an attestation or a listing
	// (JSON); zero fields are [bundle.DefaultLimits]'. An import holds a
	// bundle to the same.
	Limits bundle.Limits
}

// Stats count what a [Fetch] did.
type Stats struct {
	Objects int   // objects fetched and adopted
	Bytes   int64 // their bytes
	Skipped int   // objects the store held already
}

// kind is what the record says an object is, which decides its refs.
type kind int

const (
	plain       kind = iota // no refs: unit, grants, manifest, transcript, receipt, journal, a listed file
	attestation             // refs: its receipt and journal
	listing                 // refs: its files
)

// fetcher is one Fetch under way.
type fetcher struct {
	ctx   context.Context
	c     *http.Client
	base  string
	st    *store.Store
	lim   bundle.Limits
	dir   string                  // staging, removed at the end
	done  map[record.Address]kind // objects dealt with, as what
	taken int64                   // bytes the peer was asked for, held to the Total limit
	buf   []byte                  // the copy buffer
	stats Stats
}

// Fetch brings into st every object rec reaches that st lacks, from the
// peer at base (its [Handler]): the objects [bundle.Reached] lists for an
// export, in its order — each object after the objects it refers to — and
// each adopted with the refs its own bytes give, as an import judges them:
// an attestation's receipt and journal (attest.Open), a listing's files
// ([store.DecodeListing], each of the size listed). An object st holds is
// not fetched; an attestation or listing st holds is read (verified) for
// its refs, which are fetched if st lacks them.
//
// Every object is streamed into st's staging area with at most the bytes
// its Content-Length declares and the limits allow, hashed on the way, and
// adopted only if it hashes to the address asked for. The first refusal
// ends the fetch: objects adopted before it are whole, verified, with
// their refs; nothing after it is adopted, and staging is removed. GC
// collects what no record comes to reach.
//
// Fetch does not judge the record: the caller imports it after, with the
// checks of an import (trust, policy, manifests), which find every object
// it reaches in st.
func Fetch(ctx context.Context, c *http.Client, base string, st *store.Store, rec *record.Record, opt Options) (Stats, error) {
	f := &fetcher{ctx: ctx, c: c, base: base, st: st, lim: opt.Limits.Or(bundle.DefaultLimits), done: map[record.Address]kind{}}
	var err error
	if f.dir, err = st.StagingDir("fetch"); err != nil {
		return Stats{}, err
	}
	defer os.RemoveAll(f.dir)
	for _, r := range roots(rec) {
		if err := f.object(r.addr, r.kind, -1); err != nil {
			return f.stats, err
		}
	}
	return f.stats, nil
}

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

// object makes sure st holds a as k, after its refs. size is the size a
// listing gives a file, or -1.
func (f *fetcher) object(a record.Address, k kind, size int64) error {
	if prev, ok := f.done[a]; ok && (prev == k || k == plain) {
		return nil
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
	if !held {
		// Verified when fetched: PutBytes hashes it again.
		if _, err := f.st.PutBytes(b, refs...); err != nil {
			return err
		}
		f.stats.Objects++
		f.stats.Bytes += int64(len(b))
		return nil
	}
	return f.keepRefs(a, b, refs)
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
		if err := f.object(e.Address, plain, int64(e.Size)); err != nil {
			return nil, fmt.Errorf("transfer: listing %s: %q: %w", a, e.Name, err)
		}
		refs = append(refs, e.Address)
	}
	return refs, nil
}

// keepRefs makes sure an object st held declares refs: a put of its bytes
// adds to its refs what they lack.
func (f *fetcher) keepRefs(a record.Address, b []byte, refs []record.Address) error {
	have, err := f.st.Refs(a)
	if err != nil {
		return err
	}
	in := make(map[record.Address]bool, len(have))
	for _, r := range have {
		in[r] = true
	}
	for _, r := range refs {
		if !in[r] {
			_, err := f.st.PutBytes(b, refs...)
			return err
		}
	}
	return nil
}

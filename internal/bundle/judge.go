package bundle

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// source is where the checks read a run's objects: a staged bundle's
// members ([Staged]) or a store's objects ([ImportStored]).
type source interface {
	// size returns a's size, or an error wrapping [store.ErrMissingObject]
	// when the source does not hold it.
	size(a record.Address) (int64, error)
	// read returns a's bytes, verified against a. The caller has checked
	// its size.
	read(a record.Address) ([]byte, error)
}

// judging is one run being judged: its record, where its objects are
// read, what it is judged by, and what the checks learn on the way.
type judging struct {
	src  source
	rec  *record.Record
	what string // "bundle of RUN": what errors name
	opt  Options
	// max caps an object read whole to be decoded (unit, grants,
	// attestations, manifests, listings): each is capped like a JSON
	// document.
	max int64
	// need is what the record reaches, filled in by reach and judged by
	// the checks after it; refs, what each object's bytes say it refers
	// to (an attestation its receipt and journal, a listing its files).
	need map[record.Address]bool
	refs map[record.Address][]record.Address
	// What the checks decoded.
	spec    unit.Spec
	grants  unit.Grants
	signers []attest.Signer
}

func newJudging(src source, rec *record.Record, what string, opt Options) *judging {
	return &judging{src: src, rec: rec, what: what, opt: opt, max: opt.Limits.Or(DefaultLimits).JSON,
		refs: map[record.Address][]record.Address{}}
}

// checks are the checks 5 to 9 of docs/bundle.md a run is judged by
// wherever its objects are, in that order, the first refusal the run's;
// a staged bundle adds what is only a bundle's (its members).
func (j *judging) checks() []func() error {
	return []func() error{
		j.checkSpec,    // 5: the unit spec decodes and validates
		j.checkGrants,  // 5: the grant set decodes and validates
		j.policy,       // 5: and passes this host's policy
		j.manifests,    // 6: every manifest names the keys its park form requires
		j.checkSigners, // 7: every attestation signed, by a trusted key, at its place
		j.reach,        // 7, 8: each attestation's evidence, every listing's files
		j.carried,      // 9: every object the record reaches is held
	}
}

// run runs checks in order; the first refusal is the error.
func run(checks []func() error) error {
	for _, check := range checks {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// judge checks the staged bundle's record against its objects: the checks
// 5 to 9 of docs/bundle.md, in that order, the first refusal the bundle's.
// Only the bundle's members count: an object the importing store happens
// to hold is no member, so that a bundle is accepted or refused for what
// it carries (verify --file, in a scratch store, judges as an import does).
func (s *Staged) judge(opt Options) error {
	j := newJudging(s, s.Record, "bundle of "+s.Header.Run, opt)
	checks := append(j.checks(),
		func() error { return s.reached(j) }, // 9: every member is one the record reaches
		func() error { return s.ordered(j) }, // 9: each member after the members it refers to
	)
	if err := run(checks); err != nil {
		return err
	}
	s.Spec, s.Grants, s.Signers, s.refs = j.spec, j.grants, j.signers, j.refs
	return nil
}

// size is member a's size; a member the bundle does not carry is
// [store.ErrMissingObject].
func (s *Staged) size(a record.Address) (int64, error) {
	n, ok := s.sizes[a]
	if !ok {
		return 0, fmt.Errorf("object %s: %w: the record reaches it, and the bundle does not carry it", a, store.ErrMissingObject)
	}
	return n, nil
}

// read returns member a's bytes, hashed as they were staged.
func (s *Staged) read(a record.Address) ([]byte, error) { return os.ReadFile(s.staged[a]) }

// have says whether the source holds a.
func (j *judging) have(a record.Address) bool { _, err := j.src.size(a); return err == nil }

// read returns object a's bytes, to be decoded: an object the source does
// not hold is [store.ErrMissingObject], one over the cap of a decoded
// document [ErrLimit].
func (j *judging) read(a record.Address) ([]byte, error) {
	n, err := j.src.size(a)
	if err != nil {
		return nil, err
	}
	if n > j.max {
		return nil, fmt.Errorf("%w: object %s of %d bytes is decoded, and the limit of a decoded document is %d", ErrLimit, a, n, j.max)
	}
	return j.src.read(a)
}

// checkSpec decodes and validates the unit spec: first, since nothing of
// a run is worth judging for a unit this daemon cannot run.
func (j *judging) checkSpec() error {
	b, err := j.read(j.rec.Unit())
	if err != nil {
		return fmt.Errorf("%s: unit spec: %w", j.what, err)
	}
	spec, err := unit.DecodeSpec(b)
	if err == nil {
		err = spec.Validate()
	}
	if err != nil {
		return fmt.Errorf("%s: unit spec: %w", j.what, err)
	}
	j.spec = *spec
	return nil
}

// checkGrants decodes and validates the grant set, a request this host
// judges by its policy next. A mount source that is not a clean absolute
// path is refused as policy (it could name anything).
func (j *judging) checkGrants() error {
	b, err := j.read(j.rec.Grants())
	if err != nil {
		return fmt.Errorf("%s: grant set: %w", j.what, err)
	}
	grants, err := unit.DecodeGrants(b)
	if err == nil {
		err = grants.Validate()
	}
	if errors.Is(err, unit.ErrSource) {
		return fmt.Errorf("%s: grant set: %w: %w", j.what, ErrPolicy, err)
	}
	if err != nil {
		return fmt.Errorf("%s: grant set: %w", j.what, err)
	}
	j.grants = *grants
	return nil
}

// policy judges the grant set by this host's [Policy], unless this host
// already granted it: a run it holds with this genesis ran under these
// very grants (see [Options]).
func (j *judging) policy() error {
	opt := j.opt
	if opt.Policy != nil && (opt.Granted == nil || !opt.Granted(j.rec.Genesis())) {
		if err := opt.Policy.Check(j.grants); err != nil {
			return fmt.Errorf("%s: %w", j.what, err)
		}
	}
	return nil
}

// manifests checks that every Suspended segment's manifest decodes and
// names the keys its park form requires: one that names none of a host's
// facts would match any host.
func (j *judging) manifests() error {
	rec := j.rec
	for i := range rec.Len() {
		seg := rec.Segment(i)
		if seg.Kind != record.Suspended {
			continue
		}
		b, err := j.read(seg.Manifest)
		if err != nil {
			return fmt.Errorf("%s: segment %d: manifest: %w", j.what, i, err)
		}
		m, err := manifest.Decode(b)
		if err != nil {
			return fmt.Errorf("%s: segment %d: %w", j.what, i, err)
		}
		if miss := m.Missing(m.Required(seg.Snapshot.IsTranscript())); len(miss) > 0 {
			return fmt.Errorf("%w: %s: segment %d: manifest %s lacks keys its park form requires: %s",
				ErrMalformed, j.what, i, seg.Manifest, strings.Join(miss, ", "))
		}
	}
	return nil
}

// checkSigners checks every attestation: signed, by a trusted key (when
// Options.Trusted judges signers), at its place. An untrusted signer is
// reported first: what it signed is not worth judging further.
func (j *judging) checkSigners() error {
	var err error
	j.signers, err = attest.CheckRecord(j.rec, j.read, j.opt.Trusted)
	if j.opt.Trusted != nil {
		if err := attest.Untrusted(j.signers); err != nil {
			return fmt.Errorf("%s: %w", j.what, err)
		}
	}
	if err != nil {
		return fmt.Errorf("%s: %w", j.what, err)
	}
	return nil
}

// reach walks the record for what it reaches, and the refs each object
// refers to: the unit and grants; each Executed segment's attestation and
// its evidence; each park's manifest and snapshot, and an image
// snapshot's listed files. It comes after the signers are judged, so that
// only attestations already checked are opened for their evidence.
func (j *judging) reach() error {
	rec := j.rec
	j.need = map[record.Address]bool{rec.Unit(): true, rec.Grants(): true}
	listed := map[record.Address]bool{} // a Resumed segment repeats its park's snapshot
	for i := range rec.Len() {
		seg := rec.Segment(i)
		switch seg.Kind {
		case record.Executed:
			if err := j.reachEvidence(i, seg); err != nil {
				return err
			}
		case record.Suspended:
			j.need[seg.Manifest] = true
			fallthrough
		case record.Resumed:
			if err := j.reachSnapshot(i, seg, listed); err != nil {
				return err
			}
		}
	}
	return nil
}

// reachEvidence reaches an Executed segment's attestation and the run's
// evidence it names, the receipt and the journal, which are its refs.
// audit_prev links the exporting host's audit chain, other runs'
// attestations a bundle of one run does not carry: it is not reached.
func (j *judging) reachEvidence(i int, seg record.Segment) error {
	j.need[seg.Attestation] = true
	b, err := j.read(seg.Attestation)
	if err != nil {
		return err
	}
	body, err := attest.Open(b, nil)
	if err != nil {
		return fmt.Errorf("%s: %w", j.what, &record.SegmentError{Index: i, Err: err})
	}
	j.refs[seg.Attestation] = []record.Address{body.Receipt, body.Journal}
	j.need[body.Receipt], j.need[body.Journal] = true, true
	return nil
}

// reachSnapshot reaches a park's snapshot and, for an image park, each
// listing held and each file listed, which are the listing's refs. A
// listing must decode strictly, keep the rules of the chunked form for
// its chunked files (store.ChunkedFiles), and give each file held the size
// it has (check 8). A listing not held is left to carried to report; one already
// listed (by the park a Resumed segment repeats) is not read again.
func (j *judging) reachSnapshot(i int, seg record.Segment, listed map[record.Address]bool) error {
	for _, a := range seg.Snapshot.Addresses() {
		j.need[a] = true
		if seg.Snapshot.IsTranscript() || !j.have(a) || listed[a] {
			continue
		}
		listed[a] = true
		b, err := j.read(a)
		if err != nil {
			return err
		}
		es, err := store.DecodeListing(b)
		if err == nil {
			// The chunked forms (docs/store.md, "Chunked files",
			// "Slabs"): names, sizes, address ranges of every chunk
			// and, in the slab form, every byte of its index, judged
			// here against the slabs' listed sizes.
			_, err = store.ChunkedFiles(es, func(e store.Entry) ([]byte, error) { return j.read(e.Address) })
		}
		if err != nil {
			return fmt.Errorf("%w: %s: segment %d: snapshot %s: %w", ErrMalformed, j.what, i, a, err)
		}
		for _, e := range es {
			if n, err := j.src.size(e.Address); err == nil && uint64(n) != e.Size {
				return fmt.Errorf("%w: %s: segment %d: snapshot %s lists %q as %d bytes, and its object %s has %d",
					ErrMalformed, j.what, i, a, e.Name, e.Size, e.Address, n)
			}
			j.refs[a] = append(j.refs[a], e.Address)
			j.need[e.Address] = true
		}
	}
	return nil
}

// carried checks that every object the record reaches is held: a bundle
// is whole, and a store holds what a stored record reaches.
func (j *judging) carried() error {
	for a := range j.need {
		if _, err := j.src.size(a); err != nil {
			return fmt.Errorf("%s: %w", j.what, err)
		}
	}
	return nil
}

// reached checks that every member is one the record reaches: a bundle
// carries nothing else.
func (s *Staged) reached(j *judging) error {
	for _, a := range s.order {
		if !j.need[a] {
			return fmt.Errorf("%w: object %s is not one the record reaches", ErrMalformed, a)
		}
	}
	return nil
}

// ordered checks that each member comes after the members it refers to:
// the order they are adopted in, so that a store never holds an object
// before its refs.
func (s *Staged) ordered(j *judging) error {
	at := make(map[record.Address]int, len(s.order))
	for i, a := range s.order {
		at[a] = i
	}
	for _, a := range s.order {
		for _, r := range j.refs[a] {
			if at[r] > at[a] {
				return fmt.Errorf("%w: object %s comes before %s, which it refers to", ErrMalformed, a, r)
			}
		}
	}
	return nil
}

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

// judging is one staged bundle being judged: what it is judged by, and
// what the checks learn on the way (what the record reaches).
type judging struct {
	s   *Staged
	opt Options
	// max caps an object read whole to be decoded (unit, grants,
	// attestations, manifests, listings): each is capped like a JSON
	// document.
	max int64
	// need is what the record reaches, filled in by reach and judged by
	// the checks after it.
	need map[record.Address]bool
}

// judge checks the staged bundle's record against its objects: the checks
// 5 to 9 of docs/bundle.md, in that order, the first refusal the bundle's.
// Only the bundle's members count: an object the importing store happens
// to hold is no member, so that a bundle is accepted or refused for what
// it carries (verify --file, in a scratch store, judges as an import does).
func (s *Staged) judge(opt Options) error {
	j := &judging{s: s, opt: opt, max: opt.Limits.Or(DefaultLimits).JSON}
	for _, check := range []func() error{
		j.spec,      // 5: the unit spec decodes and validates
		j.grants,    // 5: the grant set decodes and validates
		j.policy,    // 5: and passes this host's policy
		j.manifests, // 6: every manifest names the keys its park form requires
		j.signers,   // 7: every attestation signed, by a trusted key, at its place
		j.reach,     // 7, 8: each attestation's evidence, every listing's files
		j.carried,   // 9: every object the record reaches is a member
		j.reached,   // 9: every member is one the record reaches
		j.ordered,   // 9: each member after the members it refers to
	} {
		if err := check(); err != nil {
			return err
		}
	}
	return nil
}

// have says whether a is a member of the bundle.
func (j *judging) have(a record.Address) bool { _, ok := j.s.staged[a]; return ok }

// read returns member a's bytes, to be decoded: a member the bundle does
// not carry is [store.ErrMissingObject], one over the cap of a decoded
// document [ErrLimit].
func (j *judging) read(a record.Address) ([]byte, error) {
	p, ok := j.s.staged[a]
	if !ok {
		return nil, fmt.Errorf("object %s: %w: the record reaches it, and the bundle does not carry it", a, store.ErrMissingObject)
	}
	if n := j.s.sizes[a]; n > j.max {
		return nil, fmt.Errorf("%w: object %s of %d bytes is decoded, and the limit of a decoded document is %d", ErrLimit, a, n, j.max)
	}
	return os.ReadFile(p)
}

// spec decodes and validates the unit spec: first, since nothing of a
// bundle is worth judging for a unit this daemon cannot run.
func (j *judging) spec() error {
	run := j.s.Header.Run
	b, err := j.read(j.s.Record.Unit())
	if err != nil {
		return fmt.Errorf("bundle of %s: unit spec: %w", run, err)
	}
	spec, err := unit.DecodeSpec(b)
	if err == nil {
		err = spec.Validate()
	}
	if err != nil {
		return fmt.Errorf("bundle of %s: unit spec: %w", run, err)
	}
	j.s.Spec = *spec
	return nil
}

// grants decodes and validates the grant set, a request this host judges
// by its own policy next. A mount no host grants ([unit.ErrSource]) is
// this host's policy refusing it: [ErrPolicy].
func (j *judging) grants() error {
	run := j.s.Header.Run
	b, err := j.read(j.s.Record.Grants())
	if err != nil {
		return fmt.Errorf("bundle of %s: grant set: %w", run, err)
	}
	grants, err := unit.DecodeGrants(b)
	if err == nil {
		err = grants.Validate()
	}
	if errors.Is(err, unit.ErrSource) {
		return fmt.Errorf("bundle of %s: grant set: %w: %w", run, ErrPolicy, err)
	}
	if err != nil {
		return fmt.Errorf("bundle of %s: grant set: %w", run, err)
	}
	j.s.Grants = *grants
	return nil
}

// policy judges the grant set by this host's [Policy], unless this host
// already granted it: a run it holds with this genesis ran under these
// very grants (see [Options]).
func (j *judging) policy() error {
	opt := j.opt
	if opt.Policy != nil && (opt.Granted == nil || !opt.Granted(j.s.Record.Genesis())) {
		if err := opt.Policy.Check(j.s.Grants); err != nil {
			return fmt.Errorf("bundle of %s: %w", j.s.Header.Run, err)
		}
	}
	return nil
}

// manifests checks that every Suspended segment's manifest decodes and
// names the keys its park form requires: one that names none of a host's
// facts would match any host.
func (j *judging) manifests() error {
	rec, run := j.s.Record, j.s.Header.Run
	for i := range rec.Len() {
		seg := rec.Segment(i)
		if seg.Kind != record.Suspended {
			continue
		}
		b, err := j.read(seg.Manifest)
		if err != nil {
			return fmt.Errorf("bundle of %s: segment %d: manifest: %w", run, i, err)
		}
		m, err := manifest.Decode(b)
		if err != nil {
			return fmt.Errorf("bundle of %s: segment %d: %w", run, i, err)
		}
		if miss := m.Missing(manifest.KeysFor(seg.Snapshot.IsTranscript())); len(miss) > 0 {
			return fmt.Errorf("%w: bundle of %s: segment %d: manifest %s lacks keys its park form requires: %s",
				ErrMalformed, run, i, seg.Manifest, strings.Join(miss, ", "))
		}
	}
	return nil
}

// signers checks every attestation: signed, by a trusted key (when
// Options.Trusted judges signers), at its place. An untrusted signer is
// reported first: what it signed is not worth judging further.
func (j *judging) signers() error {
	run := j.s.Header.Run
	var err error
	j.s.Signers, err = attest.CheckRecord(j.s.Record, j.read, j.opt.Trusted)
	if j.opt.Trusted != nil {
		if err := attest.Untrusted(j.s.Signers); err != nil {
			return fmt.Errorf("bundle of %s: %w", run, err)
		}
	}
	if err != nil {
		return fmt.Errorf("bundle of %s: %w", run, err)
	}
	return nil
}

// reach walks the record for what it reaches, and the refs each object is
// stored with: the unit and grants; each Executed segment's attestation
// and its evidence; each park's manifest and snapshot, and an image
// snapshot's listed files. It comes after the signers are judged, so that
// only attestations already checked are opened for their evidence.
func (j *judging) reach() error {
	rec := j.s.Record
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
		return fmt.Errorf("bundle of %s: %w", j.s.Header.Run, &record.SegmentError{Index: i, Err: err})
	}
	j.s.refs[seg.Attestation] = []record.Address{body.Receipt, body.Journal}
	j.need[body.Receipt], j.need[body.Journal] = true, true
	return nil
}

// reachSnapshot reaches a park's snapshot and, for an image park, each
// listing it carries and each file listed, which are the listing's refs.
// A listing must decode strictly and give each file the size of its
// member (check 8). A listing the bundle does not carry is left to
// carried to report; one already listed (by the park a Resumed segment
// repeats) is not read again.
func (j *judging) reachSnapshot(i int, seg record.Segment, listed map[record.Address]bool) error {
	run := j.s.Header.Run
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
		if err != nil {
			return fmt.Errorf("%w: bundle of %s: segment %d: snapshot %s: %w", ErrMalformed, run, i, a, err)
		}
		for _, e := range es {
			if n, ok := j.s.sizes[e.Address]; ok && uint64(n) != e.Size {
				return fmt.Errorf("%w: bundle of %s: segment %d: snapshot %s lists %q as %d bytes, and its object %s has %d",
					ErrMalformed, run, i, a, e.Name, e.Size, e.Address, n)
			}
			j.s.refs[a] = append(j.s.refs[a], e.Address)
			j.need[e.Address] = true
		}
	}
	return nil
}

// carried checks that every object the record reaches is a member: a
// bundle is whole.
func (j *judging) carried() error {
	for a := range j.need {
		if !j.have(a) {
			return fmt.Errorf("bundle of %s: object %s: %w: the record reaches it, and the bundle does not carry it", j.s.Header.Run, a, store.ErrMissingObject)
		}
	}
	return nil
}

// reached checks that every member is one the record reaches: a bundle
// carries nothing else.
func (j *judging) reached() error {
	for _, a := range j.s.order {
		if !j.need[a] {
			return fmt.Errorf("%w: object %s is not one the record reaches", ErrMalformed, a)
		}
	}
	return nil
}

// ordered checks that each member comes after the members it refers to:
// the order they are adopted in, so that a store never holds an object
// before its refs.
func (j *judging) ordered() error {
	order := j.s.order
	at := make(map[record.Address]int, len(order))
	for i, a := range order {
		at[a] = i
	}
	for _, a := range order {
		for _, r := range j.s.refs[a] {
			if at[r] > at[a] {
				return fmt.Errorf("%w: object %s comes before %s, which it refers to", ErrMalformed, a, r)
			}
		}
	}
	return nil
}

// Package resume enforces the three resumption preconditions, in order,
// each its own error:
//
//  1. the offered snapshot is content-identical, by address, to the one the
//     record suspended ([*SnapshotError]);
//  2. the recorded manifest names every key its park form requires
//     ([manifest.Manifest.Required]), and this host's environment
//     satisfies it, key by key, each by its rule ([manifest.Judge])
//     ([*ManifestError], listing the keys missing or failing);
//  3. the record verifies from genesis ([*RecordError]).
//
// [Check] is pure: the caller hashes what is offered, reads the recorded
// manifest object and gathers the host's facts. A refusal changes nothing,
// so the run stays parked and resumable with the right inputs.
package resume

import (
	"errors"
	"fmt"
	"strings"

	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// ErrNotParked is a resume of a run that is not parked.
var ErrNotParked = errors.New("run is not parked")

// SnapshotError is precondition 1 failing.
type SnapshotError struct {
	Recorded, Offered record.Snapshot
}

func (e *SnapshotError) Error() string {
	return fmt.Sprintf("snapshot mismatch: the run parked %s, but the snapshot offered is %s; resume with the snapshot the record names (re-import the run's bundle if the local copy is damaged)", e.Recorded, e.Offered)
}

// Unwrap makes errors.Is(err, record.ErrSnapshotMismatch) hold.
func (e *SnapshotError) Unwrap() error { return record.ErrSnapshotMismatch }

// ManifestError is precondition 2 failing: the recorded manifest lacks
// keys its park form requires (Missing), or this host does not satisfy
// some of its keys (Diffs).
type ManifestError struct {
	Recorded record.Address
	Diffs    []manifest.Difference
	Missing  []string
}

func (e *ManifestError) Error() string {
	if len(e.Missing) > 0 {
		return fmt.Sprintf("environment manifest %s lacks keys its park form requires: %s; a manifest that names none of a host's facts would match any host, so this run cannot be resumed",
			e.Recorded, strings.Join(e.Missing, ", "))
	}
	var lines []string
	for _, d := range e.Diffs {
		lines = append(lines, d.String())
	}
	hint := "resume on a host that satisfies it (docs/manifest.md)"
	for _, d := range e.Diffs {
		if d.Key == manifest.ImageDigest {
			hint = "import the unit's image (the one with the recorded digest) with `runrecordd images import`, or " + hint
		}
	}
	return fmt.Sprintf("environment manifest mismatch: this host does not satisfy the recorded manifest %s; keys that fail: %s; %s",
		e.Recorded, strings.Join(lines, "; "), hint)
}

// Keys returns the keys that fail: missing, then not satisfied.
func (e *ManifestError) Keys() []string {
	k := append([]string(nil), e.Missing...)
	for _, d := range e.Diffs {
		k = append(k, d.Key)
	}
	return k
}

// RecordError is precondition 3 failing.
type RecordError struct{ Err error }

func (e *RecordError) Error() string {
	return fmt.Sprintf("record does not verify from genesis: %v", e.Err)
}

func (e *RecordError) Unwrap() error { return e.Err }

// Inputs are what a resume is judged on.
type Inputs struct {
	// Unit, Grants, Segments and Heads are the run's record as stored: the
	// segments decoded from their stored bytes and the head stored beside
	// each. The last segment is Suspended.
	Unit, Grants record.Address
	Segments     []record.Segment
	Heads        []record.Address
	// Offered is the snapshot reference recomputed from the bytes offered
	// for restore (the directory and file addresses as hashed now, not as
	// named).
	Offered record.Snapshot
	// RecordedManifest is the manifest object named by the Suspended
	// segment, as read from the store.
	RecordedManifest manifest.Manifest
	// Host is this host's facts; only the recorded keys are judged.
	Host manifest.Manifest
}

// Suspension returns the last segment when it is a Suspended one.
func Suspension(segs []record.Segment) (record.Segment, error) {
	if len(segs) == 0 || segs[len(segs)-1].Kind != record.Suspended {
		return record.Segment{}, ErrNotParked
	}
	return segs[len(segs)-1], nil
}

// Check applies the three preconditions in order.
func Check(in Inputs) error {
	susp, err := Suspension(in.Segments)
	if err != nil {
		return err
	}
	if err := in.Offered.Validate(); err != nil {
		return &SnapshotError{Recorded: susp.Snapshot, Offered: in.Offered}
	}
	if !in.Offered.Equal(susp.Snapshot) {
		return &SnapshotError{Recorded: susp.Snapshot, Offered: in.Offered}
	}

	recAddr, err := in.RecordedManifest.Address()
	if err != nil {
		return fmt.Errorf("recorded manifest: %w", err)
	}
	if recAddr != susp.Manifest {
		return fmt.Errorf("recorded manifest object hashes to %s, the record names %s: the store is damaged", recAddr, susp.Manifest)
	}
	if miss := in.RecordedManifest.Missing(in.RecordedManifest.Required(susp.Snapshot.IsTranscript())); len(miss) > 0 {
		return &ManifestError{Recorded: susp.Manifest, Missing: miss}
	}
	if diffs := manifest.Judge(in.RecordedManifest, in.Host); len(diffs) > 0 {
		return &ManifestError{Recorded: susp.Manifest, Diffs: diffs}
	}

	if err := record.Verify(in.Unit, in.Grants, in.Segments, in.Heads); err != nil {
		return &RecordError{Err: err}
	}
	return nil
}

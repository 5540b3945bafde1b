// Package answers is what the daemon answers, in the record's and the
// evidence's own types: a run's Summary and Status, a Parked, a Resumed,
// an Imported, a Posted, a Verification, the HostInfo, and the timed Steps
// of an operation (Clock); and whom a run is started for (Booking). It is
// the vocabulary between the daemon and its service layer:
// internal/server turns these into the API's wire types, and nothing here
// knows a JSON tag. [Summarize] reads a run's Summary from the store: its
// status from its phase, its handoff and retention, and whether it
// executes here.
package answers

import (
	"time"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/idle"
	"github.com/runrecordd/runrecordd/internal/imageparks"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/trust"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Status is what a run is on this host, beyond its record's phase.
type Status int

// A run's statuses.
const (
	// Lost is a run executing in its record with no sandbox on this host.
	Lost Status = iota
	Running
	ParkedImage
	ParkedTranscript
	// HandedOff is a run an export handed to another host.
	HandedOff
	// Copy is a run imported from a copy bundle: it never resumes here.
	Copy
	Closed
)

var statusNames = [...]string{Lost: "lost", Running: "running", ParkedImage: "parked (image)",
	ParkedTranscript: "parked (transcript)", HandedOff: "handed off", Copy: "copy", Closed: "closed"}

// String is the status as `runrecordd list` shows it.
func (s Status) String() string {
	if s < 0 || int(s) >= len(statusNames) {
		return "unknown"
	}
	return statusNames[s]
}

// Summary is a run as this host holds it.
type Summary struct {
	ID       string
	Phase    record.Phase
	Status   Status
	Segments int
	Head     record.Address
	Unit     record.Address
	Grants   record.Address
	// Spec is the run's unit, nil when its object cannot be read.
	Spec      *unit.Spec
	HandedOff bool
	Pinned    bool
	Released  bool // its image snapshots were released by retention
	// Started is when the run began executing, ParkedAt when its last
	// interval ended while it is parked: from its record (Summarize);
	// zero when unknown.
	Started, ParkedAt time.Time
}

// Step is one timed step of an operation.
type Step struct {
	Name string
	Took time.Duration
}

// Parked is a recorded park.
type Parked struct {
	Run        Summary
	Snapshot   record.Snapshot
	Manifest   record.Address
	Retained   int64
	Receipt    attest.Receipt       // the parked interval's
	Checkpoint *attest.Checkpointed // an image park's CRIU statistics
	Took       time.Duration
	Steps      []Step
}

// Resumed is a recorded resume.
type Resumed struct {
	Run     Summary
	Idle    attest.Idle      // what the park drew, as the Resumed segment records it
	Restore *attest.Restored // an image resume's statistics
	Took    time.Duration
	Steps   []Step
}

// Signer is a signer of one of a record's intervals, named as this host
// knows its key.
type Signer = trust.Signer

// Imported is a stored bundle.
type Imported struct {
	Run     Summary
	Objects int
	Bytes   int64
	Grants  unit.Grants
	Signers []Signer
	// Unclaimed is why, in a fleet, this host does not own the imported
	// run (stored here, not resumable); nil when it does, or alone.
	Unclaimed error
}

// Posted is a result taken into the call ledger.
type Posted struct {
	Run, Call string
	// Awaiting lists the calls the parked run still awaits.
	Awaiting []string
	// Resumed is the resume the post made: the last awaited result came.
	Resumed *Resumed
	// ResumeErr is why that resume was refused. The result is kept; the
	// run stays parked.
	ResumeErr error
}

// Verification is a record verified from genesis with every object it
// reaches rehashed. Err says what failed, nil when all held.
type Verification struct {
	Run       string
	Segments  int
	Phase     record.Phase
	Head      record.Address
	WaitProof record.Verdict
	Signers   []Signer
	Objects   int
	Bytes     int64
	// Owed is how many slabs a post-copy migration still owes the run
	// (store.Owing), not among Objects; Owing says where their fetch is.
	Owed  int
	Owing *Owing
	Err   error
}

// HostInfo is a daemon's host: its key, where it keeps its state, its
// containerd, the facts its manifests record, and what it can meter and
// park.
type HostInfo struct {
	KeyID      record.Address
	StateDir   string
	Containerd string // its address
	Embedded   bool   // started and supervised by the daemon
	Manifest   manifest.Manifest
	Meter      idle.Snapshot
	ImageParks imageparks.Status
	// CRIU is the CRIU build the executor runs; CRIUOff says which fast
	// paths are off for want of a patch, and why.
	CRIU    criu.Build
	CRIUOff []string
	// UserNS is whether units run in user namespaces (serve
	// --user-namespaces); image units only where ImageParks.UserNS.
	UserNS bool
	// HostRootImages: image units may run as the host's root (serve
	// --allow-host-root-images).
	HostRootImages bool
	// Holds are the runs held here for post-copy targets (docs/fleet.md,
	// "Post-copy").
	Holds []Hold
	// Owings are the runs brought in here post-copy that owe slabs.
	Owings []Owing
}

// Owing is a run a post-copy migration from Source (handed over at Head)
// brings in here, owing Slabs slabs, and its fetch's State: "fetching",
// "waiting" (Reason: the last try's error, at Tried), "stopped", or
// "stranded" (Reason: why, since Tried).
type Owing struct {
	Run           string
	Source, Head  record.Address
	Slabs         int
	State, Reason string
	Tried         time.Time
}

// Hold is a run held here for the post-copy target it was handed to at
// Head, since Since: served to it until it says it holds every object,
// and at the latest until Ends.
type Hold struct {
	Run          string
	Target, Head record.Address
	Since, Ends  time.Time
}

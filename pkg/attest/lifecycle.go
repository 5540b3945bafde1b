package attest

import (
	"bytes"
	"encoding/json"
)

// A lifecycle entry's data is an event name, then, when the event has a
// detail, one space and the detail as JSON (encoding/json's form: fields in
// the order below, HTML characters escaped). docs/attestation.md lists the
// events; lifecycle_test.go pins each detail's bytes. These types, not the
// API's, are what the journal holds: renaming an API field never changes
// the bytes of evidence.

// Detail is a lifecycle event's detail.
type Detail interface {
	// Event is the event's name, the entry's first word.
	Event() string
}

// Events without a detail.
const (
	EventStarted      = "started"       // a run's first sandbox started
	EventResumed      = "resumed"       // a transcript run's next sandbox started
	EventRestored     = "restored"      // an image run's sandbox restored (then a Restored detail)
	EventReattached   = "reattached"    // a restarted daemon took the interval back
	EventParkRefused  = "park-refused"  // a park was not recorded; the unit went on in this interval
	EventCloseRefused = "close-refused" // a close was not recorded; the unit went on in this interval
	EventExitRefused  = "exit-refused"  // a unit's exit was not recorded; the run waits for a close in this interval
)

// Checkpointed is what a park's CRIU dump cost, journaled at the end of the
// interval it ends.
type Checkpointed struct {
	TotalNS    int64  `json:"total_ns"`
	PauseNS    int64  `json:"pause_ns"`
	DumpNS     int64  `json:"dump_ns"`
	DiffNS     int64  `json:"diff_ns"`
	FreezingNS int64  `json:"freezing_ns"`
	FrozenNS   int64  `json:"frozen_ns"`
	MemDumpNS  int64  `json:"mem_dump_ns"`
	MemWriteNS int64  `json:"mem_write_ns"`
	Pages      uint64 `json:"pages_written"`
	PagesScan  uint64 `json:"pages_scanned"`
	ImageBytes int64  `json:"image_bytes"`
	RootBytes  int64  `json:"rootfs_bytes"`
	IngestNS   int64  `json:"ingest_ns"`
}

// Event implements Detail.
func (Checkpointed) Event() string { return "checkpointed" }

// Restored is what a resume's CRIU restore cost, journaled at the start of
// the interval it begins.
type Restored struct {
	TotalNS       int64  `json:"total_ns"`
	MaterializeNS int64  `json:"materialize_ns"`
	RootfsNS      int64  `json:"rootfs_ns"`
	TaskNS        int64  `json:"task_ns"`
	ForkingNS     int64  `json:"forking_ns"`
	RestoreNS     int64  `json:"restore_ns"`
	Pages         uint64 `json:"pages_restored"`
	// Lazy is a lazy restore (docs/lazy-resume.md): TotalNS is then the
	// time to running, and the rest of the unit's memory arrives after
	// it (a Resident or a PagesLost entry follows). Absent when eager.
	Lazy bool `json:"lazy,omitempty"`
	// Served is a lazy restore whose lazy pages a page server sends,
	// each chunk verified against its listed address before its first
	// page (docs/lazy-resume.md, "The page server"), instead of every
	// byte rehashed before the restore. Absent otherwise.
	Served bool `json:"served,omitempty"`
}

// Event implements Detail.
func (Restored) Event() string { return EventRestored }

// Resident is a lazy restore's every page resident: NS from the restore's
// start (the Restored entry's TotalNS counts from the same instant), the
// time to all resident.
type Resident struct {
	NS int64 `json:"ns"`
}

// Event implements Detail.
func (Resident) Event() string { return "resident" }

// PagesLost is a lazy restore whose pages stopped arriving before every
// one was resident (docs/lazy-resume.md): AfterNS from the restore's
// start, and why. The unit was frozen and killed before it could read a
// page that never came; the interval ends Killed.
type PagesLost struct {
	AfterNS int64  `json:"after_ns"`
	Reason  string `json:"reason"`
}

// Event implements Detail.
func (PagesLost) Event() string { return "pages-lost" }

// UnitLost is an interval whose unit a starting daemon found gone: it
// died with its host or its runtime while no daemon watched it. The
// interval ends parked at the snapshot it resumed from (an image run), or
// at the transcript it left (a transcript run, then Recovered too).
type UnitLost struct {
	Reason string `json:"reason"`
}

// Event implements Detail.
func (UnitLost) Event() string { return "unit-lost" }

// Idle is how a resume metered or estimated the idle energy its Resumed
// segment records. (Its fields are in the order of their JSON names.)
type Idle struct {
	Inputs        map[string]string `json:"inputs"`
	ParkedNS      int64             `json:"parked_ns"`
	Provenance    string            `json:"provenance"`
	RetainedBytes int64             `json:"retained_bytes"`
	UJ            uint64            `json:"uj"`
}

// Event implements Detail.
func (Idle) Event() string { return "idle" }

// Recovered says why an interval was recorded by a restarted daemon
// without its call account.
type Recovered struct {
	Reason string `json:"reason"`
}

// Event implements Detail.
func (Recovered) Event() string { return "recovered" }

// OutputOmitted is output an interval's journal leaves out past its
// per-stream bound: Bytes bytes of Stream from FromOffset of its file.
type OutputOmitted struct {
	Stream     EntryKind `json:"stream"`
	FromOffset int64     `json:"from_offset"`
	Bytes      int64     `json:"bytes"`
}

// Event implements Detail.
func (OutputOmitted) Event() string { return "output-omitted" }

// OutputDiscarded is output the sandbox discarded in the interval, past
// the unit's log limit.
type OutputDiscarded struct {
	StdoutBytes uint64 `json:"stdout_bytes"`
	StderrBytes uint64 `json:"stderr_bytes"`
	LimitBytes  uint64 `json:"limit_bytes"`
}

// Event implements Detail.
func (OutputDiscarded) Event() string { return "output-discarded" }

// Event returns a lifecycle entry at atNS of an event without a detail.
func Event(atNS int64, event string) Entry {
	return Entry{Kind: Lifecycle, AtNS: atNS, Data: []byte(event)}
}

// LifecycleOf returns the lifecycle entry at atNS of d's event.
func LifecycleOf(atNS int64, d Detail) Entry {
	b := []byte(d.Event())
	if j, err := json.Marshal(d); err == nil {
		b = append(append(b, ' '), j...)
	}
	return Entry{Kind: Lifecycle, AtNS: atNS, Data: b}
}

// LifecyclesOf returns the lifecycle entries at atNS of ds's events, in
// order.
func LifecyclesOf(atNS int64, ds []Detail) []Entry {
	es := make([]Entry, len(ds))
	for i, d := range ds {
		es[i] = LifecycleOf(atNS, d)
	}
	return es
}

// Find fills d from the first lifecycle entry of j with d's event and a
// detail that decodes; false when there is none.
func (j *Journal) Find(d Detail) bool {
	prefix := []byte(d.Event() + " ")
	for _, e := range j.Entries {
		if e.Kind != Lifecycle {
			continue
		}
		if rest, ok := bytes.CutPrefix(e.Data, prefix); ok && json.Unmarshal(rest, d) == nil {
			return true
		}
	}
	return false
}

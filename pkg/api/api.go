// Package api is runrecordd's HTTP/JSON API: the request and response
// bodies under /v1, the error body and its codes, its description
// ([OpenAPI]), and a [Client] that speaks it over the daemon's unix socket
// or, as a platform key, over the fleet's mutual-TLS listener. The daemon
// serves it (internal/server); the command-line verbs and tests use the
// Client.
//
// # Errors
//
// Every failure is a JSON [Error] with a stable Code (the Code* constants)
// and an HTTP status chosen from it. A resume refused by a precondition
// carries the precondition's fields: the differing manifest keys, the
// segment a record fails at.
package api

import (
	"encoding/json"
	"time"

	"github.com/runrecordd/runrecordd/pkg/unit"
)

// Error codes. They are stable: scripts and the CLI's exit codes key off
// them.
const (
	CodeBadRequest        = "bad_request"             // malformed input: fix the request
	CodeNotFound          = "not_found"               // no such run, image or call
	CodeExists            = "exists"                  // a run id already in use
	CodeConflict          = "conflict"                // another operation on the run is in progress, or its head moved
	CodePhase             = "phase"                   // the run's phase forbids it (park while parked, anything after close)
	CodeSnapshotMismatch  = "snapshot_mismatch"       // resume precondition 1
	CodeManifestMismatch  = "manifest_mismatch"       // resume precondition 2
	CodeRecordInvalid     = "record_invalid"          // resume precondition 3, or an import that does not verify
	CodeObjectCorrupt     = "object_corrupt"          // an object whose bytes do not hash to its address
	CodeMissingObject     = "missing_object"          // an object the operation needs is not stored
	CodeCallRefused       = "call_refused"            // a call result the run cannot accept
	CodeUnavailable       = "unavailable"             // the host cannot do it now (containerd down, CRIU failing)
	CodeInternal          = "internal"                // a bug or an unexpected host failure
	CodeCheckpointFailed  = "checkpoint_failed"       // CRIU could not dump; the unit keeps running
	CodeRestoreFailed     = "restore_failed"          // CRIU could not restore; the run stays parked
	CodeCheckpointTimeout = "checkpoint_timeout"      // CRIU's dump passed its deadline and was killed; the unit goes on as it was
	CodeRestoreTimeout    = "restore_timeout"         // CRIU's restore passed its deadline and was killed; the run stays parked
	CodePagesLost         = "pages_lost"              // a park of a lazily resumed unit whose pages stopped arriving: the run goes back to the snapshot it resumed from (docs/lazy-resume.md)
	CodeImageParks        = "image_parks_unavailable" // this host cannot checkpoint and restore (its probe failed); transcript runs still work
	CodeDaemonUnreachable = "daemon_unreachable"      // client side only: nothing answers on the socket
	CodeNoSpace           = "no_space"                // a park refused before it wrote: too little free space, or the run's snapshot quota; or secrets the secrets tmpfs has no room for
	CodeHandedOff         = "handed_off"              // the run was exported to another host: import a bundle extending it back first
	CodeGenesisHeld       = "genesis_held"            // a bundle of a run this host holds under another id, or one that does not extend the run it holds
	CodeUntrustedSigner   = "untrusted_signer"        // a bundle with an attestation by a host key this host does not trust (Signer names it)
	CodeGrantRefused      = "grant_refused"           // a bundle's grant set this host's policy refuses (a mount source outside the allow-list)
	CodeImageRefused      = "image_refused"           // a snapshot's CRIU images grant more than the run's spec and grants (the message names the task and field); the run stays parked
	CodeBundleLimit       = "bundle_too_large"        // a bundle, object or JSON member over this host's bundle limits
	CodeNotOwner          = "not_owner"               // in a fleet: another host owns the run, or this host's ownership cannot be confirmed (docs/fleet.md)
	CodeDraining          = "draining"                // a new run on a host being drained
	CodeForbidden         = "forbidden"               // on the fleet's mTLS listener: a key whose role may not use this route (a platform on a peer route, a peer on the API)
	CodeQuota             = "quota"                   // a platform key at one of its quotas on this host: runs at once, or store bytes (docs/fleet.md, "Roles")
	CodeSecretsRequired   = "secrets_required"        // a run whose grant set names secrets this host holds no value for (after a reboot, an import or a migration): give them with the request; nothing changed
	CodeNotHeld           = "not_held"                // a run brought here post-copy whose source can serve its owed slabs no more (stranded): it cannot resume, move or export; close it (docs/fleet.md, "Post-copy")
)

// Error is the body of every failed request.
type Error struct {
	Code    string `json:"code"`
	Message string `json:"error"`
	// Keys are the manifest keys that fail (manifest_mismatch).
	Keys []string `json:"keys,omitempty"`
	// Segment is the index of the segment concerned (record_invalid,
	// phase), when there is one.
	Segment *int `json:"segment,omitempty"`
	// Signer is the key id of the untrusted signer (untrusted_signer).
	Signer string `json:"signer,omitempty"`
	// Status is the HTTP status it came with (client side only).
	Status int `json:"-"`
}

func (e *Error) Error() string { return e.Message }

// Image is an image imported into the host's containerd.
type Image struct {
	Name   string `json:"name"`
	Digest string `json:"digest"`
}

// RunRequest starts a run.
type RunRequest struct {
	// ID is the run's id; the daemon makes one when empty. 1–64
	// characters of [A-Za-z0-9_.-], not starting with '.' or '-'.
	ID     string      `json:"id,omitempty"`
	Unit   unit.Spec   `json:"unit"`
	Grants unit.Grants `json:"grants"`
	// Secrets are the values of the secrets the unit reads, by name: the
	// grant set's secrets (its names are these when it names none). They
	// reach the sandbox as files /run/secrets/NAME and nothing else
	// (docs/trust.md, "Secrets").
	Secrets map[string]string `json:"secrets,omitempty"`
}

// Run is a run's summary: GET /v1/runs and the result of most verbs.
type Run struct {
	ID     string `json:"id"`
	Phase  string `json:"phase"` // executing, parked, closed
	Status string `json:"status"`
	// Status says more than the phase: running, parked (image), parked
	// (transcript), handed off (exported to another host), copy (a parked
	// copy of a run held elsewhere), lost (executing in the record but no
	// sandbox on this host: resume it elsewhere or close it), closed. A
	// unit that exits by itself closes its run.
	Segments int    `json:"segments"`
	Head     string `json:"head"`
	Unit     string `json:"unit_id"`
	Grants   string `json:"grants_id"`
	Image    string `json:"image,omitempty"`
	Mode     string `json:"mode,omitempty"`
	// HandedOff is set while the run lives on another host: an export
	// handed it off, and nothing resumes or closes it here until a bundle
	// extending its record is imported back.
	HandedOff bool `json:"handed_off,omitempty"`
	// Pinned runs keep their snapshots whatever the retention time;
	// Released closed runs have had their image snapshots collected.
	Pinned   bool `json:"pinned,omitempty"`
	Released bool `json:"released,omitempty"`
	// Started is when the run's first interval began; ParkedAt, while the
	// run is parked, when its last interval ended. Both come from the
	// record's attestations; Started of a run still in its first interval
	// is the open interval's start on this host. Absent when unknown
	// (docs/cli.md, "list").
	Started  time.Time `json:"started,omitzero"`
	ParkedAt time.Time `json:"parked_at,omitzero"`
}

// Checkpoint is what an image park's CRIU dump cost, as recorded in the
// interval's replay journal.
type Checkpoint struct {
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

// Restore is what a resume's CRIU restore cost.
type Restore struct {
	TotalNS       int64  `json:"total_ns"`
	MaterializeNS int64  `json:"materialize_ns"`
	RootfsNS      int64  `json:"rootfs_ns"`
	TaskNS        int64  `json:"task_ns"`
	ForkingNS     int64  `json:"forking_ns"`
	RestoreNS     int64  `json:"restore_ns"`
	Pages         uint64 `json:"pages_restored"`
	// Lazy is a lazy restore (serve --lazy-resume, docs/lazy-resume.md):
	// TotalNS is its time to running; ResidentNS, from the same start,
	// its time to every page resident, once known (absent while pages
	// are still arriving); PagesLost why they stopped arriving, when
	// they did (the run went back to the snapshot it resumed from).
	Lazy       bool   `json:"lazy,omitempty"`
	ResidentNS int64  `json:"resident_ns,omitempty"`
	PagesLost  string `json:"pages_lost,omitempty"`
	// Served is a lazy restore whose lazy pages a page server sent,
	// each chunk verified before its first page (serve --lazy-served).
	Served bool `json:"served,omitempty"`
}

// Park is the result of POST /v1/runs/{id}/park.
type Park struct {
	Run        Run         `json:"run"`
	Snapshot   string      `json:"snapshot"`
	Manifest   string      `json:"manifest"`
	Retained   int64       `json:"retained_bytes"`
	Receipt    Energy      `json:"receipt"`
	Checkpoint *Checkpoint `json:"checkpoint,omitempty"`
	DurationNS int64       `json:"duration_ns"`
	// Steps is where the time went, in order.
	Steps []Step `json:"steps,omitempty"`
}

// Step is one timed step of an operation.
type Step struct {
	Name string `json:"name"`
	NS   int64  `json:"ns"`
}

// Resume is the result of POST /v1/runs/{id}/resume.
type Resume struct {
	Run        Run      `json:"run"`
	Idle       Energy   `json:"idle"`
	ParkedNS   int64    `json:"parked_ns"`
	Restore    *Restore `json:"restore,omitempty"`
	DurationNS int64    `json:"duration_ns"`
	Steps      []Step   `json:"steps,omitempty"`
}

// Energy is a figure in microjoules with its provenance.
type Energy struct {
	UJ         uint64            `json:"uj"`
	Provenance string            `json:"provenance"` // measured, estimated
	Method     string            `json:"method,omitempty"`
	Inputs     map[string]string `json:"inputs,omitempty"`
}

// Segment is one segment of a run as `show` prints it.
type Segment struct {
	Index int    `json:"index"`
	Kind  string `json:"kind"`
	Head  string `json:"head"`
	// Executed.
	Attestation string       `json:"attestation,omitempty"`
	Interval    uint64       `json:"interval,omitempty"`
	Start       *time.Time   `json:"start,omitempty"`
	End         *time.Time   `json:"end,omitempty"`
	Outcome     string       `json:"outcome,omitempty"`
	Receipt     *Energy      `json:"receipt,omitempty"`
	CPUNS       uint64       `json:"cpu_ns,omitempty"`
	Calls       *CallAccount `json:"calls,omitempty"`
	Checkpoint  *Checkpoint  `json:"checkpoint,omitempty"`
	// Restore is the CRIU restore the interval began with (an image
	// resume), from its journal.
	Restore *Restore `json:"restore,omitempty"`
	Host    string   `json:"host,omitempty"`
	// Suspended and Resumed.
	Snapshot string `json:"snapshot,omitempty"`
	Form     string `json:"form,omitempty"` // image, transcript
	Manifest string `json:"manifest,omitempty"`
	// Resumed.
	Idle *Energy `json:"idle,omitempty"`
	// Closed.
	Reason string `json:"reason,omitempty"`
}

// CallAccount is an interval's account of outward calls.
type CallAccount struct {
	Dispatched []string `json:"dispatched"`
	Resolved   []string `json:"resolved"`
}

// Totals is a run's energy.
type Totals struct {
	ActiveUJ         uint64 `json:"active_uj"`
	ActiveProvenance string `json:"active_provenance"` // measured, estimated, mixed, none
	IdleUJ           uint64 `json:"idle_uj"`
	IdleProvenance   string `json:"idle_provenance"` // measured, estimated, none
	CostUJ           uint64 `json:"cost_uj"`
}

// Show is GET /v1/runs/{id}: the run, its segments and its energy.
type Show struct {
	Run       Run          `json:"run"`
	Unit      *unit.Spec   `json:"unit,omitempty"`
	Grants    *unit.Grants `json:"grants,omitempty"`
	Segments  []Segment    `json:"segments"`
	Totals    Totals       `json:"totals"`
	WaitProof WaitProof    `json:"wait_proof"`
	// Stdout is the file the unit's output goes to on this host.
	Stdout string `json:"stdout,omitempty"`
	// Restore is the CRIU restore the run's open interval on this host
	// began with, as its journal has it so far (a lazy restore's
	// resident_ns appears once every page is in); absent when the run
	// does not execute here, or began otherwise.
	Restore *Restore `json:"restore,omitempty"`
}

// WaitProof is a record's wait-proof verdict.
type WaitProof struct {
	Verdict string `json:"verdict"` // NonBlocking, Blocked, Malformed, Unproved
	Segment *int   `json:"segment,omitempty"`
	Reason  string `json:"reason"`
}

// Verify is GET /v1/runs/{id}/verify: the record verified from genesis and
// every object it reaches rehashed.
type Verify struct {
	Run      string `json:"run"`
	OK       bool   `json:"ok"`
	Segments int    `json:"segments"`
	Phase    string `json:"phase"`
	Head     string `json:"head"`
	Objects  int    `json:"objects"`
	Bytes    int64  `json:"bytes"`
	// Owed is how many slabs of the run's last memory image a post-copy
	// migration still brings in (docs/fleet.md, "Post-copy").
	Owed int `json:"owed,omitempty"`
	// Owing is where the fetch of the owed slabs is; absent when none.
	Owing     *PostCopyOwing `json:"owing,omitempty"`
	WaitProof WaitProof      `json:"wait_proof"`
	// Signers are the signers of the record's attestations, each placed
	// (genesis, interval, previous head) and said trusted or not.
	Signers []Signer `json:"signers"`
	Error   *Error   `json:"error,omitempty"`
}

// Host is GET /v1/host: who this daemon is.
type Host struct {
	KeyID      string            `json:"key_id"`
	StateDir   string            `json:"state_dir"`
	Containerd string            `json:"containerd"` // its address
	Embedded   bool              `json:"embedded"`
	Manifest   map[string]string `json:"manifest"`
	RAPL       bool              `json:"rapl"`
	RAPLReason []string          `json:"rapl_reasons,omitempty"`
	ImageParks ImageParks        `json:"image_parks"`
	// UserNamespaces is whether units run in user namespaces of their
	// runs' own (serve --user-namespaces, on by default); otherwise as
	// the host's root. Image units do where ImageParks.UserNamespaces.
	UserNamespaces bool `json:"user_namespaces"`
	// HostRootImages: image units may run as the host's root (serve
	// --allow-host-root-images).
	HostRootImages bool      `json:"host_root_images"`
	CRIU           CRIUBuild `json:"criu"`
	// PostCopyHolds are the runs held here for post-copy targets
	// (docs/fleet.md, "Post-copy").
	PostCopyHolds []PostCopyHold `json:"post_copy_holds,omitempty"`
	// PostCopyOwings are the runs brought in here post-copy that owe
	// slabs (docs/fleet.md, "Post-copy").
	PostCopyOwings []PostCopyOwing `json:"post_copy_owings,omitempty"`
}

// PostCopyOwing is a run brought in here post-copy from Source (a host
// key id), handed over at Head, owing Slabs slabs, and its fetch's State:
// "fetching", "waiting" to try again (Reason: the last try's error, at
// Tried), "stopped" (the daemon serves alone, or stops), or "stranded"
// (Reason: why the source can serve the slabs no more, since Tried).
type PostCopyOwing struct {
	Run    string     `json:"run"`
	Source string     `json:"source"`
	Head   string     `json:"head"`
	Slabs  int        `json:"slabs"`
	State  string     `json:"state"`
	Reason string     `json:"reason,omitempty"`
	Tried  *time.Time `json:"tried,omitempty"`
}

// PostCopyHold is a run held here for the post-copy target it was handed
// to (Target, a host key id) at Head: served to it until it says it holds
// every object, and at the latest until Ends unless it reads of it again
// (Since: made, or renewed by its target's last read, kept hourly).
type PostCopyHold struct {
	Run    string    `json:"run"`
	Target string    `json:"target"`
	Head   string    `json:"head"`
	Since  time.Time `json:"since"`
	Ends   time.Time `json:"ends"`
}

// CRIUBuild is the CRIU a daemon runs: the build deploy/setup.sh recorded
// (docs/setup.md, "The CRIU build"), what it can do, and the fast paths
// off for want of a patch.
type CRIUBuild struct {
	Binary  string `json:"binary,omitempty"`
	Version string `json:"version"`
	// Known is set when the binary is the one its build manifest
	// describes; Unknown says why not otherwise.
	Known   bool   `json:"known"`
	Unknown string `json:"unknown,omitempty"`
	// Source is the source tarball, when known.
	Source *CRIUFile `json:"source,omitempty"`
	// Patches are the deploy/criu patches the build carries: the
	// manifest's, or (not known) those whose mark the binary holds, with
	// no sha256.
	Patches      []CRIUFile `json:"patches"`
	Capabilities []string   `json:"capabilities"`
	// Off names each fast path turned off for want of a patch, and why.
	Off []string `json:"off,omitempty"`
}

// CRIUFile is a file of a CRIU build by name and sha256.
type CRIUFile struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256,omitempty"`
}

// ImageParks says whether this host can image-park: what the daemon's
// probe at start (a throwaway process and container dumped and restored
// under a deadline) found.
type ImageParks struct {
	// Status is "probing", "available" or "unavailable".
	Status string `json:"status"`
	// Reason is why not, when unavailable.
	Reason string `json:"reason,omitempty"`
	// Notes say how they work here, e.g. with hardware breakpoints off.
	Notes   []string `json:"notes,omitempty"`
	ProbeNS int64    `json:"probe_ns,omitempty"`
	// UserNamespaces: image units run in user namespaces (the probe
	// dumped and restored in one).
	UserNamespaces bool `json:"user_namespaces,omitempty"`
}

// Call is an outward call a run dispatched and has not resolved: GET
// /v1/calls.
type Call struct {
	Run          string          `json:"run"`
	Phase        string          `json:"phase"` // the run's
	ID           string          `json:"id"`
	Kind         string          `json:"kind"`
	Payload      json.RawMessage `json:"payload"`
	ResultPosted bool            `json:"result_posted"`
}

// PostResult is the result of POST /v1/runs/{id}/calls/{call}/result: the
// result is stored; when it was the last one a parked run awaited, the run
// resumed (Resumed), or could not (ResumeError: it stays parked).
type PostResult struct {
	Run         string   `json:"run"`
	Call        string   `json:"call"`
	Awaiting    []string `json:"awaiting,omitempty"`
	Resumed     *Resume  `json:"resumed,omitempty"`
	ResumeError *Error   `json:"resume_error,omitempty"`
}

// Event is one transition on the host, as GET /v1/events streams them (one
// JSON object per line).
type Event struct {
	Time     time.Time `json:"time"`
	Kind     string    `json:"kind"` // run.started, run.parked, run.resumed, run.closed, call.dispatched, call.result; run.resident, run.pages-lost (a lazy resume: docs/lazy-resume.md)
	Run      string    `json:"run"`
	Call     string    `json:"call,omitempty"`
	CallKind string    `json:"call_kind,omitempty"`
	Detail   string    `json:"detail,omitempty"`
}

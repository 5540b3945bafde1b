package api

import "github.com/runrecordd/runrecordd/pkg/unit"

// The host's operations beyond a run's own verbs: collection, close,
// drains and migrations, imports, and the keys it trusts.

// GC is POST /v1/gc: what a collection released and removed.
type GC struct {
	Released     []string `json:"released"` // closed runs whose image snapshots were released now
	Removed      int      `json:"removed"`  // objects removed
	RemovedBytes int64    `json:"removed_bytes"`
	Kept         int      `json:"kept"` // objects left
	KeptBytes    int64    `json:"kept_bytes"`
}

// GCRequest is POST /v1/gc's body; RetentionNS, when set, replaces the
// daemon's retention time for this collection (negative: release nothing).
type GCRequest struct {
	RetentionNS *int64 `json:"retention_ns,omitempty"`
	// GraceNS, when set, replaces the hour an object no record reaches is
	// kept (it may be about to be named by a park or an import in flight).
	GraceNS *int64 `json:"grace_ns,omitempty"`
}

// ResumeRequest is POST /v1/runs/{id}/resume's body, which may be
// empty: Secrets, when given, are the values of every secret the run's
// grant set names, replacing the ones this host holds; without them the
// host must hold each (else secrets_required).
type ResumeRequest struct {
	Secrets map[string]string `json:"secrets,omitempty"`
}

// CloseRequest closes a run.
type CloseRequest struct {
	Reason string `json:"reason"`
}

// DrainRequest moves every run off the daemon's host (POST /v1/drain): to
// the hosts of the key ids To (every other host of the fleet when empty),
// Parallel runs at a time (when 0, the host's default: 4).
type DrainRequest struct {
	To       []string `json:"to,omitempty"`
	Parallel int      `json:"parallel,omitempty"`
}

// Drain is a drain's outcome: each run, where it went or why it stayed.
type Drain struct {
	Runs  []Drained `json:"runs"`
	Moved int       `json:"moved"`
	Left  int       `json:"left"`
}

// Drained is one run of a drain.
type Drained struct {
	Run    string `json:"run"`
	To     string `json:"to,omitempty"`
	Error  *Error `json:"error,omitempty"`
	TookNS int64  `json:"took_ns"` // the run's migration, every host tried
}

// MigrateRequest moves a run to another host of the fleet (POST
// /v1/runs/{id}/migrate): To is that host's key id. The answer is the run
// as this host now holds it (handed off).
type MigrateRequest struct {
	To string `json:"to"`
}

// Import is the result of POST /v1/import: the run, what was stored, the
// grants the run will resume under and who signed its attestations.
type Import struct {
	Run     Run         `json:"run"`
	Objects int         `json:"objects"`
	Bytes   int64       `json:"bytes"`
	Grants  unit.Grants `json:"grants"`
	Signers []Signer    `json:"signers"`
	// Unclaimed is why, on a host in a fleet, the run is not this host's
	// (another host owns it): it is stored here but not resumable. Absent
	// when the host owns it, or runs alone.
	Unclaimed *Error `json:"unclaimed,omitempty"`
}

// Signer is the signer of one attestation of a record.
type Signer struct {
	Segment  int    `json:"segment"`  // the Executed segment
	Interval uint64 `json:"interval"` // its ordinal
	Key      string `json:"key"`      // the host key id
	Name     string `json:"name,omitempty"`
	Trusted  bool   `json:"trusted"`
}

// TrustedKey is a host key this daemon trusts: GET /v1/trust lists them,
// POST /v1/trust adds one ({"key": ..., "name": ...}), DELETE
// /v1/trust/{key} removes one. The daemon's own key is always trusted and
// listed with Self set; it cannot be removed.
type TrustedKey struct {
	Key  string `json:"key"`
	Name string `json:"name,omitempty"`
	Self bool   `json:"self,omitempty"`
}

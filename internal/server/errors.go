package server

import (
	"context"
	"errors"
	"net/http"

	"github.com/containerd/errdefs"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/daemon"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/imageparks"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/park"
	"github.com/runrecordd/runrecordd/internal/resume"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/internal/trust"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// The API's errors: every error the daemon returns maps to one stable code
// (ErrorOf), and every code to one HTTP status (Status). This file is the
// one place that does either.

// ErrorOf classifies err for the API: its stable code, and the fields a
// caller acts on (the differing manifest keys, the segment concerned).
// The order matters: the most specific class wins.
func ErrorOf(err error) *api.Error {
	e := &api.Error{Message: err.Error()}
	var (
		se *resume.SnapshotError
		me *resume.ManifestError
		re *resume.RecordError
		ce *store.CorruptError
		sg *record.SegmentError
		ue *attest.UntrustedError
		pe *attest.PlaceError
	)
	switch {
	case errors.As(err, &ue):
		e.Code, e.Signer = api.CodeUntrustedSigner, ue.Key.String()
		i := ue.Index
		e.Segment = &i
	case errors.As(err, &pe):
		e.Code = api.CodeRecordInvalid
		i := pe.Index
		e.Segment = &i
	case errors.Is(err, bundle.ErrPolicy):
		e.Code = api.CodeGrantRefused
	case errors.Is(err, bundle.ErrLimit):
		e.Code = api.CodeBundleLimit
	case errors.As(err, &se):
		e.Code = api.CodeSnapshotMismatch
	case errors.As(err, &me):
		e.Code, e.Keys = api.CodeManifestMismatch, me.Keys()
	case errors.As(err, &re):
		e.Code = api.CodeRecordInvalid
	case errors.As(err, &ce):
		e.Code = api.CodeObjectCorrupt
	case errors.Is(err, store.ErrMissingObject):
		e.Code = api.CodeMissingObject
	case errors.Is(err, record.ErrClosed), errors.Is(err, record.ErrParked), errors.Is(err, record.ErrNotParked), errors.Is(err, record.ErrAlternation),
		errors.Is(err, resume.ErrNotParked), errors.Is(err, daemon.ErrNoSandbox), errors.Is(err, daemon.ErrResultsHeld):
		e.Code = api.CodePhase
	case errors.Is(err, record.ErrHeadMismatch), errors.Is(err, record.ErrCanonical), errors.Is(err, store.ErrDamaged), errors.Is(err, record.ErrOverflow),
		errors.Is(err, attest.ErrSignature), errors.Is(err, attest.ErrMalformed):
		e.Code = api.CodeRecordInvalid
	case errors.Is(err, store.ErrNoRun), errors.Is(err, executor.ErrNotFound), errdefs.IsNotFound(err),
		errors.Is(err, store.ErrNotTrusted):
		e.Code = api.CodeNotFound
	case errors.Is(err, park.ErrNoSpace), errors.Is(err, executor.ErrTooLarge), errors.Is(err, store.ErrListing):
		e.Code = api.CodeNoSpace
	case errors.Is(err, store.ErrHandedOff):
		e.Code = api.CodeHandedOff
	case errors.Is(err, store.ErrGenesisHeld), errors.Is(err, store.ErrNotExtension):
		e.Code = api.CodeGenesisHeld
	case errors.Is(err, store.ErrRunExists), errors.Is(err, executor.ErrExists):
		e.Code = api.CodeExists
	case errors.Is(err, store.ErrHeadMoved), errors.Is(err, daemon.ErrBusy):
		e.Code = api.CodeConflict
	case errors.Is(err, daemon.ErrCall):
		e.Code = api.CodeCallRefused
	case errors.Is(err, executor.ErrCheckpointTimeout):
		e.Code = api.CodeCheckpointTimeout
	case errors.Is(err, executor.ErrRestoreTimeout):
		e.Code = api.CodeRestoreTimeout
	case errors.Is(err, imageparks.ErrUnavailable):
		e.Code = api.CodeImageParks
	case errors.Is(err, executor.ErrCheckpoint):
		e.Code = api.CodeCheckpointFailed
	case errors.Is(err, executor.ErrRestore):
		e.Code = api.CodeRestoreFailed
	case errors.Is(err, daemon.ErrInvalid), errors.Is(err, daemon.ErrBundle), errors.Is(err, unit.ErrInvalid),
		errors.Is(err, executor.ErrInvalid), errors.Is(err, executor.ErrImageMismatch), errors.Is(err, store.ErrRunID),
		errors.Is(err, manifest.ErrMalformed), errors.Is(err, record.ErrMalformedSegment), errors.Is(err, record.ErrMalformedSnapshot),
		errors.Is(err, record.ErrAddress), errors.Is(err, store.ErrKeyName), errors.Is(err, daemon.ErrTranscript), errors.Is(err, trust.ErrKey):
		e.Code = api.CodeBadRequest
	case errors.Is(err, executor.ErrMissing), errors.Is(err, manifest.ErrMissing), errors.Is(err, store.ErrLocked),
		errors.Is(err, context.DeadlineExceeded), errdefs.IsUnavailable(err):
		e.Code = api.CodeUnavailable
	default:
		e.Code = api.CodeInternal
	}
	if errors.As(err, &sg) {
		i := sg.Index
		e.Segment = &i
	}
	return e
}

// Status maps an error code to its HTTP status: the one place that does.
func Status(code string) int {
	switch code {
	case api.CodeBadRequest:
		return http.StatusBadRequest
	case api.CodeNotFound:
		return http.StatusNotFound
	case api.CodeExists, api.CodeConflict, api.CodePhase, api.CodeHandedOff, api.CodeGenesisHeld:
		return http.StatusConflict
	case api.CodeSnapshotMismatch, api.CodeManifestMismatch, api.CodeRecordInvalid, api.CodeObjectCorrupt,
		api.CodeMissingObject, api.CodeCallRefused:
		return http.StatusUnprocessableEntity
	case api.CodeUnavailable, api.CodeCheckpointFailed, api.CodeRestoreFailed, api.CodeImageParks:
		return http.StatusServiceUnavailable
	case api.CodeCheckpointTimeout, api.CodeRestoreTimeout:
		return http.StatusGatewayTimeout
	case api.CodeNoSpace:
		return http.StatusInsufficientStorage
	case api.CodeUntrustedSigner, api.CodeGrantRefused:
		return http.StatusForbidden
	case api.CodeBundleLimit:
		return http.StatusRequestEntityTooLarge
	default:
		return http.StatusInternalServerError
	}
}

func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	e := ErrorOf(err)
	if e.Code == api.CodeInternal {
		h.log.Error("api", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	writeJSON(w, Status(e.Code), e)
}

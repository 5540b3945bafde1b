package server

import (
	"context"
	"errors"
	"net/http"

	"github.com/containerd/errdefs"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/calls"
	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/criu/pageserver"
	"github.com/runrecordd/runrecordd/internal/egress"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/fleet/drain"
	"github.com/runrecordd/runrecordd/internal/fleet/member"
	"github.com/runrecordd/runrecordd/internal/fleet/peer"
	"github.com/runrecordd/runrecordd/internal/forms"
	"github.com/runrecordd/runrecordd/internal/idmap"
	"github.com/runrecordd/runrecordd/internal/imageparks"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/park"
	"github.com/runrecordd/runrecordd/internal/platform"
	"github.com/runrecordd/runrecordd/internal/resume"
	"github.com/runrecordd/runrecordd/internal/secrets"
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

// ErrorOf classifies err for the API: its stable code (the first rule of
// codes that matches), and the fields a caller acts on (the signer, the
// differing manifest keys, the segment concerned).
func ErrorOf(err error) *api.Error {
	e := &api.Error{Message: err.Error(), Code: api.CodeInternal}
	for _, r := range codes {
		if r.match(err) {
			e.Code = r.code
			if r.fill != nil {
				r.fill(err, e)
			}
			break
		}
	}
	var sg *record.SegmentError
	if errors.As(err, &sg) {
		e.Segment = ptr(sg.Index)
	}
	return e
}

// codes are the classes of error, in order: the most specific first.
var codes = []struct {
	code  string
	match func(error) bool
	fill  func(error, *api.Error) // the fields a caller acts on
}{
	// Another host's refusal keeps its code and fields when the code is
	// one a daemon answers; any other (the host's own bytes, or a newer
	// version's) is internal, the message naming it: the code goes on to
	// callers and into runrecordd_failures_total's label.
	{api.CodeInternal, as[*peer.RemoteError], func(err error, e *api.Error) {
		re := asT[*peer.RemoteError](err)
		if !api.KnownCode(re.Answer.Code) || re.Answer.Code == api.CodeDaemonUnreachable {
			return
		}
		e.Code, e.Keys, e.Segment, e.Signer = re.Answer.Code, re.Answer.Keys, re.Answer.Segment, re.Answer.Signer
	}},
	{api.CodeUntrustedSigner, as[*attest.UntrustedError], func(err error, e *api.Error) {
		ue := asT[*attest.UntrustedError](err)
		e.Signer, e.Segment = ue.Key.String(), ptr(ue.Index)
	}},
	{api.CodeRecordInvalid, as[*attest.PlaceError], func(err error, e *api.Error) { e.Segment = ptr(asT[*attest.PlaceError](err).Index) }},
	{api.CodeGrantRefused, is(bundle.ErrPolicy), nil},
	{api.CodeGrantRefused, is(forms.ErrNoEgress), nil},
	{api.CodeBundleLimit, is(bundle.ErrLimit), nil},
	{api.CodeSnapshotMismatch, as[*resume.SnapshotError], nil},
	{api.CodeImageRefused, is(criu.ErrRefused), nil},
	{api.CodeManifestMismatch, as[*resume.ManifestError], func(err error, e *api.Error) { e.Keys = asT[*resume.ManifestError](err).Keys() }},
	{api.CodeManifestMismatch, is(drain.ErrManifest), nil},
	{api.CodeUnavailable, is(drain.ErrUnfit), nil},
	{api.CodeRecordInvalid, as[*resume.RecordError], nil},
	{api.CodeNotHeld, is(store.ErrStranded), nil},
	{api.CodeUnavailable, is(store.ErrOwed), nil},
	{api.CodeObjectCorrupt, as[*store.CorruptError], nil},
	{api.CodeMissingObject, is(store.ErrMissingObject), nil},
	{api.CodePhase, is(record.ErrClosed, record.ErrParked, record.ErrNotParked, record.ErrAlternation,
		resume.ErrNotParked, answers.ErrNoSandbox, bundle.ErrResultsHeld, forms.ErrNoChannel), nil},
	{api.CodeRecordInvalid, is(forms.ErrFormMismatch, record.ErrHeadMismatch, record.ErrCanonical, store.ErrDamaged, record.ErrOverflow,
		attest.ErrSignature, attest.ErrMalformed), nil},
	{api.CodeNotFound, func(err error) bool {
		return is(store.ErrNoRun, executor.ErrNotFound, store.ErrNotTrusted)(err) || errdefs.IsNotFound(err)
	}, nil},
	{api.CodeNoSpace, is(park.ErrNoSpace, executor.ErrTooLarge, store.ErrListing, secrets.ErrNoSpace), nil},
	{api.CodeHandedOff, is(store.ErrHandedOff), nil},
	{api.CodeGenesisHeld, is(store.ErrGenesisHeld, store.ErrNotExtension), nil},
	{api.CodeExists, is(store.ErrRunExists, executor.ErrExists), nil},
	{api.CodeConflict, is(store.ErrHeadMoved, pageserver.ErrPagesArriving), nil},
	{api.CodeCallRefused, is(calls.ErrRefused), nil},
	{api.CodeCheckpointTimeout, is(executor.ErrCheckpointTimeout), nil},
	{api.CodePagesLost, is(pageserver.ErrPagesLost), nil},
	{api.CodeRestoreTimeout, is(executor.ErrRestoreTimeout), nil},
	{api.CodeImageParks, is(imageparks.ErrUnavailable), nil},
	{api.CodeCheckpointFailed, is(executor.ErrCheckpoint), nil},
	{api.CodeRestoreFailed, is(executor.ErrRestore), nil},
	{api.CodeNotOwner, is(fleet.ErrNotOwner, fleet.ErrLeaseLost, fleet.ErrNoRun), nil},
	{api.CodeConflict, is(fleet.ErrHeadMoved, fleet.ErrNotParked), nil},
	{api.CodeForbidden, is(fleet.ErrNotAdmitted, member.ErrUnsolicited), nil},
	{api.CodeUnavailable, is(member.ErrNoFleet, fleet.ErrUnavailable, fleet.ErrHostActive, member.ErrReceiving, member.ErrSending, idmap.ErrExhausted, egress.ErrFull), nil},
	{api.CodeDraining, is(member.ErrDraining), nil},
	{api.CodeUnavailable, is(answers.ErrStopping), nil},
	{api.CodeQuota, is(platform.ErrQuota), nil},
	{api.CodeSecretsRequired, is(secrets.ErrRequired), nil},
	{api.CodeBadRequest, is(answers.ErrInvalid, bundle.ErrMalformed, unit.ErrInvalid, executor.ErrInvalid, executor.ErrImageMismatch,
		store.ErrRunID, manifest.ErrMalformed, record.ErrMalformedSegment, record.ErrMalformedSnapshot, record.ErrAddress,
		store.ErrKeyName, calls.ErrTranscript, calls.ErrNotJSON, trust.ErrKey), nil},
	{api.CodeUnavailable, func(err error) bool {
		return is(executor.ErrMissing, manifest.ErrMissing, store.ErrLocked, context.DeadlineExceeded)(err) || errdefs.IsUnavailable(err)
	}, nil},
}

// is matches an error wrapping any of targets.
func is(targets ...error) func(error) bool {
	return func(err error) bool {
		for _, t := range targets {
			if errors.Is(err, t) {
				return true
			}
		}
		return false
	}
}

// as matches an error wrapping a T.
func as[T error](err error) bool {
	var t T
	return errors.As(err, &t)
}

// asT is the T err wraps.
func asT[T error](err error) T {
	var t T
	errors.As(err, &t)
	return t
}

// Status maps an error code to its HTTP status: the one place that does.
func Status(code string) int {
	switch code {
	case api.CodeBadRequest:
		return http.StatusBadRequest
	case api.CodeNotFound:
		return http.StatusNotFound
	case api.CodeExists, api.CodeConflict, api.CodePhase, api.CodeHandedOff, api.CodeGenesisHeld, api.CodeNotOwner, api.CodeNotHeld:
		return http.StatusConflict
	case api.CodeSnapshotMismatch, api.CodeManifestMismatch, api.CodeRecordInvalid, api.CodeObjectCorrupt,
		api.CodeMissingObject, api.CodeCallRefused, api.CodeSecretsRequired:
		return http.StatusUnprocessableEntity
	case api.CodeUnavailable, api.CodeCheckpointFailed, api.CodeRestoreFailed, api.CodeImageParks, api.CodeDraining, api.CodePagesLost:
		return http.StatusServiceUnavailable
	case api.CodeCheckpointTimeout, api.CodeRestoreTimeout:
		return http.StatusGatewayTimeout
	case api.CodeNoSpace:
		return http.StatusInsufficientStorage
	case api.CodeUntrustedSigner, api.CodeGrantRefused, api.CodeImageRefused, api.CodeForbidden, api.CodeQuota:
		return http.StatusForbidden
	case api.CodeBundleLimit:
		return http.StatusRequestEntityTooLarge
	default:
		return http.StatusInternalServerError
	}
}

func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	e := ErrorOf(err)
	if h.Counts != nil {
		h.Counts.Failed(r.Pattern, e.Code) // the route's pattern: no run id
	}
	switch status := Status(e.Code); {
	case e.Code == api.CodeInternal:
		h.log.Error("api", "method", r.Method, "path", r.URL.Path, "err", err)
	case status >= 500:
		// The host's own failure (a restore, a dump, lost pages): the
		// operator's log says why, as the client's answer does.
		h.log.Warn("api", "method", r.Method, "path", r.URL.Path, "code", e.Code, "err", err)
	}
	writeJSON(w, Status(e.Code), e)
}

package server

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

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
	"github.com/runrecordd/runrecordd/internal/park"
	"github.com/runrecordd/runrecordd/internal/resume"
	"github.com/runrecordd/runrecordd/internal/secrets"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// The errors of a CRIU deadline and of a host without image parks have
// codes of their own, also when wrapped as the daemon wraps them.
func TestErrorOfCRIU(t *testing.T) {
	for err, want := range map[error]string{
		fmt.Errorf("park r: executor: checkpoint r: %w: killed", executor.ErrCheckpointTimeout): api.CodeCheckpointTimeout,
		fmt.Errorf("resume r: executor: restore r: %w: killed", executor.ErrRestoreTimeout):     api.CodeRestoreTimeout,
		fmt.Errorf("run r: %w: probe failed", imageparks.ErrUnavailable):                        api.CodeImageParks,
		fmt.Errorf("park r: %w", executor.ErrCheckpoint):                                        api.CodeCheckpointFailed,
	} {
		if got := ErrorOf(err).Code; got != want {
			t.Errorf("ErrorOf(%v) = %s, want %s", err, got, want)
		}
	}
}

// A bundle's refusals have codes of their own, with the fields a caller
// acts on: the untrusted key and the segment.
func TestErrorOfBundle(t *testing.T) {
	key := record.Sum([]byte("key"))
	e := ErrorOf(fmt.Errorf("bundle of r: %w", &attest.UntrustedError{Index: 3, Key: key}))
	if e.Code != api.CodeUntrustedSigner || e.Signer != key.String() || e.Segment == nil || *e.Segment != 3 {
		t.Errorf("untrusted: %+v", e)
	}
	e = ErrorOf(fmt.Errorf("bundle of r: %w", &attest.PlaceError{Index: 1, Field: "genesis"}))
	if e.Code != api.CodeRecordInvalid || e.Segment == nil || *e.Segment != 1 {
		t.Errorf("place: %+v", e)
	}
	for err, want := range map[error]string{
		fmt.Errorf("bundle of r: %w: mount /", bundle.ErrPolicy): api.CodeGrantRefused,
		fmt.Errorf("%w: object of 5 GiB", bundle.ErrLimit):       api.CodeBundleLimit,
		fmt.Errorf("%w: sparse member", bundle.ErrMalformed):     api.CodeBadRequest,
		fmt.Errorf("key k: %w", store.ErrNotTrusted):             api.CodeNotFound,
		fmt.Errorf("%w: a key's name", store.ErrKeyName):         api.CodeBadRequest,
	} {
		if got := ErrorOf(err).Code; got != want {
			t.Errorf("ErrorOf(%v) = %s, want %s", err, got, want)
		}
	}
}

// An image refusal is image_refused even as a failed restore: the
// executor's, as the daemon returns it.
func TestErrorOfImageRefused(t *testing.T) {
	err := fmt.Errorf("resume r: executor: restore r: %w", &criu.RefusedError{Task: 1, Image: "core-1.img", Field: "creds.cap_eff", Why: "beyond"})
	if e := ErrorOf(err); e.Code != api.CodeImageRefused || !strings.Contains(e.Message, "task 1: core-1.img: creds.cap_eff") {
		t.Errorf("image refused: %+v", e)
	}
	if e := ErrorOf(fmt.Errorf("%w: %w", executor.ErrRestore, criu.ErrRefused)); e.Code != api.CodeImageRefused {
		t.Errorf("image refused as a failed restore: %+v", e)
	}
}

// The daemon's refusals of a bundle, a call and a phase each have a code
// of their own.
func TestErrorOfDaemon(t *testing.T) {
	for err, want := range map[error]string{
		fmt.Errorf("run r: %w", answers.ErrNoSandbox):                    api.CodePhase,
		fmt.Errorf("post: %w", calls.ErrNotJSON):                         api.CodeBadRequest,
		fmt.Errorf("export r: %w", bundle.ErrResultsHeld):                api.CodePhase,
		fmt.Errorf("run r: %w", park.ErrNoSpace):                         api.CodeNoSpace,
		fmt.Errorf("run r: %w", secrets.ErrNoSpace):                      api.CodeNoSpace,
		fmt.Errorf("resume r: %w", secrets.ErrRequired):                  api.CodeSecretsRequired,
		fmt.Errorf("resume r: %w: %w", store.ErrOwed, store.ErrStranded): api.CodeNotHeld,
		fmt.Errorf("resume r: %w", store.ErrOwed):                        api.CodeUnavailable,
		fmt.Errorf("post: %w", calls.ErrRefused):                         api.CodeCallRefused,
		fmt.Errorf("%w: run id", answers.ErrInvalid):                     api.CodeBadRequest,
		fmt.Errorf("%w: transcript", calls.ErrTranscript):                api.CodeBadRequest,
		fmt.Errorf("%w: tar", bundle.ErrMalformed):                       api.CodeBadRequest,
		fmt.Errorf("key: %w", store.ErrGenesisHeld):                      api.CodeGenesisHeld,
		fmt.Errorf("r: %w", store.ErrRunExists):                          api.CodeExists,
		fmt.Errorf("r: %w", store.ErrMissingObject):                      api.CodeMissingObject,
		fmt.Errorf("r: %w", executor.ErrRestore):                         api.CodeRestoreFailed,
		fmt.Errorf("r: %w", &resume.SnapshotError{}):                     api.CodeSnapshotMismatch,
		fmt.Errorf("resume r: %w", fleet.ErrNotOwner):                    api.CodeNotOwner,
		fmt.Errorf("resume r: %w", fleet.ErrUnavailable):                 api.CodeUnavailable,
		errors.New("something else"):                                     api.CodeInternal,
	} {
		if got := ErrorOf(err).Code; got != want {
			t.Errorf("ErrorOf(%v) = %s, want %s", err, got, want)
		}
	}
}

// A manifest mismatch names the differing keys, and an error about one
// segment names it, whatever its code.
func TestErrorOfFields(t *testing.T) {
	e := ErrorOf(fmt.Errorf("run r: %w", &resume.ManifestError{Missing: []string{"cpu.model"}}))
	if e.Code != api.CodeManifestMismatch || len(e.Keys) != 1 || e.Keys[0] != "cpu.model" {
		t.Fatalf("manifest mismatch: %+v", e)
	}
	e = ErrorOf(fmt.Errorf("append: %w", &record.SegmentError{Index: 4, Err: record.ErrMalformedSegment}))
	if e.Code != api.CodeBadRequest || e.Segment == nil || *e.Segment != 4 {
		t.Fatalf("segment error: %+v", e)
	}
	if e := ErrorOf(fmt.Errorf("r: %w", &resume.SnapshotError{})); e.Keys != nil || e.Segment != nil || e.Signer != "" {
		t.Fatalf("a snapshot mismatch carries fields it has none of: %+v", e)
	}
}

// A host a run does not fit refuses it under the code its resume there
// would have had: manifest_mismatch for a manifest that differs, else
// unavailable (draining, no image parks); a drain's own refusal is draining.
func TestErrorOfPlacement(t *testing.T) {
	for err, want := range map[error]string{
		fmt.Errorf("receive r: %w: arch (recorded \"x\", there \"y\")", drain.ErrManifest): api.CodeManifestMismatch,
		fmt.Errorf("receive r: %w: image parks do not work there", drain.ErrUnfit):         api.CodeUnavailable,
		fmt.Errorf("receive r: %w", member.ErrDraining):                                    api.CodeDraining,
	} {
		if got := ErrorOf(err).Code; got != want {
			t.Errorf("ErrorOf(%v) = %s, want %s", err, got, want)
		}
	}
}

// The forms' refusals: a park of a unit whose channel died with the last
// daemon is refused for the run's state (phase); a resume from the other
// form's park is a record this host will not act on (record_invalid).
func TestErrorOfForms(t *testing.T) {
	for err, want := range map[error]string{
		fmt.Errorf("park r: %w", forms.ErrNoChannel):                                      api.CodePhase,
		fmt.Errorf("park r: %w: killed", pageserver.ErrPagesLost):                         api.CodePagesLost,
		fmt.Errorf("park r: %w: %w", pageserver.ErrPagesLost, executor.ErrRestoreTimeout): api.CodePagesLost,
		fmt.Errorf("park r: %w", pageserver.ErrPagesArriving):                             api.CodeConflict,
		fmt.Errorf("resume r: %w", forms.ErrFormMismatch):                                 api.CodeRecordInvalid,
		fmt.Errorf("run r: %w", &resume.RecordError{Err: forms.ErrFormMismatch}):          api.CodeRecordInvalid,
	} {
		if got := ErrorOf(err).Code; got != want {
			t.Errorf("ErrorOf(%v) = %s, want %s", err, got, want)
		}
	}
}

// A host with no user-namespace range free is unavailable, not broken.
func TestErrorOfNoRange(t *testing.T) {
	err := fmt.Errorf("resume r: %w", idmap.ErrExhausted)
	if e := ErrorOf(err); e.Code != api.CodeUnavailable || !strings.Contains(e.Message, "range") {
		t.Errorf("no range: %+v", e)
	}
}

// A host whose conntrack share or egress slots are held is unavailable:
// the run may start once others close.
func TestErrorOfEgressFull(t *testing.T) {
	err := fmt.Errorf("run r: slot 3: %w: 33 runs", egress.ErrFull)
	if e := ErrorOf(err); e.Code != api.CodeUnavailable || !strings.Contains(e.Message, "egress runs") {
		t.Errorf("egress full: %+v", e)
	}
}

// Another host's refusal keeps its code when it is one of the API's, and
// is internal otherwise: a peer's answer is its own bytes, and the code
// goes on to callers and into runrecordd_failures_total's code label on
// the unauthenticated scrape listener, which holds the API's codes alone.
func TestErrorOfRemote(t *testing.T) {
	host := record.Sum([]byte("host"))
	for code, want := range map[string]string{
		api.CodeManifestMismatch:     api.CodeManifestMismatch,
		api.CodeNotOwner:             api.CodeNotOwner,
		api.CodeInternal:             api.CodeInternal,
		"run_7f3a_said_hello":        api.CodeInternal,
		"not_found\"} 1\nevil{x=\"y": api.CodeInternal,
		strings.Repeat("x", 1<<16):   api.CodeInternal,
		api.CodeDaemonUnreachable:    api.CodeInternal, // the client's own, never a daemon's
	} {
		err := fmt.Errorf("migrate r: %w", &peer.RemoteError{Host: host, Answer: api.Error{Code: code, Message: "m", Keys: []string{"arch"}}})
		e := ErrorOf(err)
		if e.Code != want {
			t.Errorf("a peer's code %.40q: %.40q, want %s", code, e.Code, want)
		}
		if want != api.CodeInternal && !slices.Equal(e.Keys, []string{"arch"}) {
			t.Errorf("a peer's %s: keys %v, want its keys", code, e.Keys)
		}
	}
	for _, code := range apiCodes(t) {
		e := ErrorOf(&peer.RemoteError{Host: host, Answer: api.Error{Code: code}})
		if e.Code != code && code != api.CodeDaemonUnreachable {
			t.Errorf("a peer's %s: %s, want it kept", code, e.Code)
		}
	}
}

// A failure of the host's own (a 5xx) is logged with its error: internal
// at error level, the others at warn; a refusal of the request (4xx) is
// not.
func TestFailLogged(t *testing.T) {
	var buf bytes.Buffer
	h := &handler{log: slog.New(slog.NewTextHandler(&buf, nil))}
	for _, c := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("resume r: %w: criu said no", executor.ErrRestore), `level=WARN msg=api method=POST path=/v1/runs/r/resume code=restore_failed err="resume r: `},
		{errors.New("a bug"), `level=ERROR msg=api method=POST path=/v1/runs/r/resume err="a bug"`},
		{fmt.Errorf("run r: %w", record.ErrClosed), ""},
	} {
		buf.Reset()
		h.fail(httptest.NewRecorder(), httptest.NewRequest("POST", "/v1/runs/r/resume", nil), c.err)
		if got := buf.String(); c.want == "" && got != "" || !strings.Contains(got, c.want) {
			t.Errorf("%v logged %q, want %q", c.err, got, c.want)
		}
	}
}

package server

import (
	"net/http"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/api"
)

// Every code has the HTTP status docs/daemon.md gives it.
func TestStatus(t *testing.T) {
	for code, want := range map[string]int{
		api.CodeBadRequest:        http.StatusBadRequest,
		api.CodeNotFound:          http.StatusNotFound,
		api.CodeExists:            http.StatusConflict,
		api.CodeHandedOff:         http.StatusConflict,
		api.CodeNoSpace:           http.StatusInsufficientStorage,
		api.CodeGenesisHeld:       http.StatusConflict,
		api.CodeConflict:          http.StatusConflict,
		api.CodePhase:             http.StatusConflict,
		api.CodeSnapshotMismatch:  http.StatusUnprocessableEntity,
		api.CodeManifestMismatch:  http.StatusUnprocessableEntity,
		api.CodeRecordInvalid:     http.StatusUnprocessableEntity,
		api.CodeObjectCorrupt:     http.StatusUnprocessableEntity,
		api.CodeMissingObject:     http.StatusUnprocessableEntity,
		api.CodeCallRefused:       http.StatusUnprocessableEntity,
		api.CodeSecretsRequired:   http.StatusUnprocessableEntity,
		api.CodeUnavailable:       http.StatusServiceUnavailable,
		api.CodeCheckpointFailed:  http.StatusServiceUnavailable,
		api.CodeRestoreFailed:     http.StatusServiceUnavailable,
		api.CodeImageParks:        http.StatusServiceUnavailable,
		api.CodeCheckpointTimeout: http.StatusGatewayTimeout,
		api.CodeRestoreTimeout:    http.StatusGatewayTimeout,
		api.CodeInternal:          http.StatusInternalServerError,
		api.CodeUntrustedSigner:   http.StatusForbidden,
		api.CodeGrantRefused:      http.StatusForbidden,
		api.CodeImageRefused:      http.StatusForbidden,
		api.CodeForbidden:         http.StatusForbidden,
		api.CodeQuota:             http.StatusForbidden,
		api.CodeNotOwner:          http.StatusConflict,
		api.CodeNotHeld:           http.StatusConflict,
		api.CodeDraining:          http.StatusServiceUnavailable,
		api.CodePagesLost:         http.StatusServiceUnavailable,
		api.CodeBundleLimit:       http.StatusRequestEntityTooLarge,
	} {
		if got := Status(code); got != want {
			t.Errorf("Status(%s) = %d, want %d", code, got, want)
		}
	}
}

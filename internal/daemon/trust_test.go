package daemon

import (
	"errors"
	"testing"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/internal/trust"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// The trust room's refusals are typed, with the messages they always had
// (internal/server maps trust.ErrKey to bad_request, store.ErrNotTrusted to
// not_found: its errors_test.go).
func TestTrustRefusals(t *testing.T) {
	h := mustMetricsHost(t, "")
	h.d.keyID = record.Sum([]byte("this host"))
	h.d.wire()
	_, errMalformed := h.d.keys.Add("b3:nope", "x")
	for err, want := range map[error]struct {
		is  error
		msg string
	}{
		h.d.keys.Remove(h.d.keyID.String()):               {trust.ErrKey, "invalid request: this host's own key is always trusted"},
		errMalformed:                                      {trust.ErrKey, `invalid request: host key "b3:nope": malformed address: "b3:nope": 7 characters, want 46`},
		h.d.keys.Remove(record.Sum([]byte("a")).String()): {store.ErrNotTrusted, ""},
	} {
		if !errors.Is(err, want.is) || (want.msg != "" && err.Error() != want.msg) {
			t.Errorf("%v, want %v %q", err, want.is, want.msg)
		}
	}
}

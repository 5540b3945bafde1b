package daemon

import (
	"testing"

	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// The trust room's refusals are bad requests to a client, with the
// messages they always had; a key not trusted is not found.
func TestTrustRefusalCodes(t *testing.T) {
	h := mustMetricsHost(t, "")
	h.d.keyID = record.Sum([]byte("this host"))
	_, errMalformed := h.d.Trust("b3:nope", "x")
	for err, want := range map[error]struct{ code, msg string }{
		h.d.Untrust(h.d.keyID.String()):               {api.CodeBadRequest, "invalid request: this host's own key is always trusted"},
		errMalformed:                                  {api.CodeBadRequest, `invalid request: host key "b3:nope": malformed address: "b3:nope": 7 characters, want 46`},
		h.d.Untrust(record.Sum([]byte("a")).String()): {api.CodeNotFound, ""},
	} {
		e := ErrorOf(err)
		if e.Code != want.code || (want.msg != "" && e.Message != want.msg) {
			t.Errorf("ErrorOf(%v) = %s %q, want %s %q", err, e.Code, e.Message, want.code, want.msg)
		}
	}
}

package server

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/platform"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// requestOf is a request matching pattern, with {id} as id.
func requestOf(t *testing.T, pattern, id string) *http.Request {
	t.Helper()
	method, path, ok := strings.Cut(pattern, " ")
	if !ok {
		t.Fatalf("pattern %q has no method", pattern)
	}
	path = strings.ReplaceAll(path, "{id}", id)
	path = strings.ReplaceAll(path, "{call}", "c1")
	path = strings.ReplaceAll(path, "{key}", "k1")
	return httptest.NewRequest(method, path, strings.NewReader("{}"))
}

// Every route of the table, for each role: the operator reaches every
// one; a platform key reaches only the routes the table gives it, those
// naming a run only for a run it started (another's is not_found, as a
// run that does not exist), and gets 403 forbidden on the rest, and on a
// route the table does not know. A request without a platform key gets
// nothing.
func TestRouteTable(t *testing.T) {
	mine, theirs := record.Sum([]byte("platform A")), record.Sum([]byte("platform B"))
	books, err := platform.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := books.Keep("run-a", mine); err != nil {
		t.Fatal(err)
	}
	if err := books.Keep("run-b", theirs); err != nil {
		t.Fatal(err)
	}
	// Each route's handler is a stub saying it was reached, and with
	// which platform key.
	table := make([]route, len(routes))
	for i, rt := range routes {
		rt.serve = func(_ *handler, w http.ResponseWriter, r *http.Request) {
			key, _ := platformOf(r)
			w.Header().Set("X-Reached", rt.pattern)
			w.Header().Set("X-Key", key.String())
		}
		table[i] = rt
	}
	h := &handler{log: slog.New(slog.DiscardHandler), tenancy: &Tenancy{Books: books}}
	operator := h.mux(Operator, table, nil)
	keyed := func(key record.Address, ok bool) func(*http.Request) (record.Address, bool) {
		return func(*http.Request) (record.Address, bool) { return key, ok }
	}
	platformMux := h.mux(Platform, table, keyed(mine, true))
	keyless := h.mux(Platform, table, keyed(record.Address{}, false))

	serve := func(m http.Handler, r *http.Request) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		m.ServeHTTP(w, r)
		return w
	}
	code := func(w *httptest.ResponseRecorder) string {
		var e api.Error
		_ = json.Unmarshal(w.Body.Bytes(), &e)
		return e.Code
	}
	platformRoutes := map[string]bool{}
	for _, p := range Routes(Platform) {
		platformRoutes[p] = true
	}
	for _, rt := range routes {
		t.Run(rt.pattern, func(t *testing.T) {
			if w := serve(operator, requestOf(t, rt.pattern, "run-b")); w.Header().Get("X-Reached") != rt.pattern {
				t.Errorf("operator: not reached (status %d, reached %q)", w.Code, w.Header().Get("X-Reached"))
			}
			if w := serve(keyless, requestOf(t, rt.pattern, "run-a")); w.Code != http.StatusForbidden || code(w) != api.CodeForbidden {
				t.Errorf("no platform key: status %d %q, want 403 forbidden", w.Code, code(w))
			}
			own := serve(platformMux, requestOf(t, rt.pattern, "run-a"))
			other := serve(platformMux, requestOf(t, rt.pattern, "run-b"))
			if platformRoutes[rt.pattern] != (rt.platform != refused) {
				t.Errorf("Routes(Platform) and the gate disagree")
			}
			switch rt.platform {
			case refused:
				for _, w := range []*httptest.ResponseRecorder{own, other} {
					if w.Code != http.StatusForbidden || code(w) != api.CodeForbidden || w.Header().Get("X-Reached") != "" {
						t.Errorf("platform: status %d %q, want 403 forbidden", w.Code, code(w))
					}
				}
			case owned:
				if own.Header().Get("X-Reached") != rt.pattern || own.Header().Get("X-Key") != mine.String() {
					t.Errorf("platform, its own run: not reached with its key (status %d)", own.Code)
				}
				if other.Code != http.StatusNotFound || code(other) != api.CodeNotFound || other.Header().Get("X-Reached") != "" {
					t.Errorf("platform, another's run: status %d %q, want 404 not_found", other.Code, code(other))
				}
			case starts, filtered, allowed:
				if own.Header().Get("X-Reached") != rt.pattern || own.Header().Get("X-Key") != mine.String() {
					t.Errorf("platform: not reached with its key (status %d)", own.Code)
				}
			}
		})
	}
	// What changes what the host trusts or holds is never a platform's
	// (issue 33): trust, images, import (and its reclaim), gc, drain,
	// migrate, adopt, export, pin.
	for _, p := range []string{"GET /v1/trust", "POST /v1/trust", "DELETE /v1/trust/{key}", "POST /v1/images", "POST /v1/import",
		"POST /v1/gc", "POST /v1/drain", "POST /v1/runs/{id}/migrate", "POST /v1/runs/{id}/adopt", "GET /v1/runs/{id}/export",
		"POST /v1/runs/{id}/pin", "DELETE /v1/runs/{id}/pin", "GET /v1/host", "GET /metrics", "GET /v1/runs/{id}/record"} {
		if platformRoutes[p] {
			t.Errorf("%s is served to platform keys", p)
		}
	}
	if w := serve(platformMux, httptest.NewRequest("GET", "/v1/nothing", nil)); w.Code != http.StatusForbidden {
		t.Errorf("platform, an unknown route: status %d, want 403", w.Code)
	}
}

// docs/fleet.md's route table (between its "route table" markers) is the
// code's: every route once, with the gate a platform key is held to.
func TestRouteTableDoc(t *testing.T) {
	b, err := os.ReadFile("../../docs/fleet.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(b), "<!-- route table -->")
	table, _, ok2 := strings.Cut(rest, "<!-- /route table -->")
	if !ok || !ok2 {
		t.Fatal("docs/fleet.md has no <!-- route table --> … <!-- /route table -->")
	}
	doc := map[string]string{}
	for _, line := range strings.Split(table, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			t.Fatalf("row %q: want a route, the operator's column and the platform's", line)
		}
		pattern := strings.Trim(strings.TrimSpace(cells[1]), "`")
		if _, dup := doc[pattern]; dup {
			t.Errorf("%s: twice in the doc", pattern)
		}
		if op := strings.TrimSpace(cells[2]); op != "yes" {
			t.Errorf("%s: operator %q, want yes (the socket serves every route)", pattern, op)
		}
		doc[pattern] = strings.TrimSpace(cells[3])
	}
	for _, rt := range routes {
		got, ok := doc[rt.pattern]
		switch {
		case !ok:
			t.Errorf("%s: not in the doc's table", rt.pattern)
		case got != rt.platform.String():
			t.Errorf("%s: the doc says %q, the code %q", rt.pattern, got, rt.platform)
		}
		delete(doc, rt.pattern)
	}
	for p := range doc {
		t.Errorf("%s: in the doc, not in the code", p)
	}
}

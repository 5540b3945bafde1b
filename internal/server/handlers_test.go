package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/events"
	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/fleet/drain"
	"github.com/runrecordd/runrecordd/internal/fleet/member"
	"github.com/runrecordd/runrecordd/internal/imageparks"
	"github.com/runrecordd/runrecordd/internal/park"
	"github.com/runrecordd/runrecordd/internal/resume"
	"github.com/runrecordd/runrecordd/internal/retention"
	"github.com/runrecordd/runrecordd/internal/runlog"
	"github.com/runrecordd/runrecordd/internal/secrets"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/internal/testhost"
	"github.com/runrecordd/runrecordd/internal/trust"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// fake answers every role of Deps: each call returns err (nil: success)
// and records the call's name.
type fake struct {
	err   error
	calls []string
}

func (f *fake) call(name string) error { f.calls = append(f.calls, name); return f.err }

func (f *fake) Host() answers.HostInfo { f.calls = append(f.calls, "Host"); return answers.HostInfo{} }
func (f *fake) ImportImage(context.Context, io.Reader, string) (executor.Image, error) {
	return executor.Image{Name: "img"}, f.call("ImportImage")
}
func (f *fake) StartBooked(_ context.Context, id string, _ unit.Spec, _ unit.Grants, _ answers.Starting) (answers.Summary, error) {
	return answers.Summary{ID: id}, f.call("StartBooked")
}
func (f *fake) List(*record.Phase) ([]answers.Summary, error) { return nil, f.call("List") }
func (f *fake) Run(id string) (answers.Summary, error)        { return answers.Summary{ID: id}, f.call("Run") }
func (f *fake) Park(_ context.Context, id string) (answers.Parked, error) {
	return answers.Parked{Run: answers.Summary{ID: id}}, f.call("Park")
}
func (f *fake) Resume(_ context.Context, id string, _ map[string]string) (answers.Resumed, error) {
	return answers.Resumed{Run: answers.Summary{ID: id}}, f.call("Resume")
}
func (f *fake) Close(_ context.Context, id, _ string) (answers.Summary, error) {
	return answers.Summary{ID: id}, f.call("Close")
}
func (f *fake) ParkAll(context.Context, int) ([]answers.Each[answers.Parked], error) {
	return nil, f.call("ParkAll")
}
func (f *fake) Pin(id string, _ bool) (answers.Summary, error) {
	return answers.Summary{ID: id}, f.call("Pin")
}
func (f *fake) Verify(_ context.Context, id string) (answers.Verification, error) {
	return answers.Verification{Run: id}, f.call("Verify")
}
func (f *fake) Exportable(string) error { return f.call("Exportable") }
func (f *fake) Export(context.Context, string, io.Writer, bool) error {
	f.calls = append(f.calls, "Export")
	return nil
}
func (f *fake) ImportWith(context.Context, io.Reader, string, bool) (answers.Imported, error) {
	return answers.Imported{}, f.call("ImportWith")
}
func (f *fake) PostResult(context.Context, string, string, []byte) (answers.Posted, error) {
	return answers.Posted{}, f.call("PostResult")
}
func (f *fake) Logs(context.Context, string, runlog.Options, func(runlog.Chunk) error) error {
	return f.call("Logs")
}
func (f *fake) Stdout(string) string                         { return "" }
func (f *fake) OpenJournal(string) *attest.Journal           { return nil }
func (f *fake) StoredBytes([]answers.Summary) (int64, error) { return 0, f.call("StoredBytes") }
func (f *fake) Offer(context.Context, []string) (drain.Offer, error) {
	return drain.Offer{}, f.call("Offer")
}

func (f *fake) Add(key, name string) (trust.Key, error) { return trust.Key{Name: name}, f.call("Add") }
func (f *fake) Remove(string) error                     { return f.call("Remove") }
func (f *fake) List2() ([]trust.Key, error)             { return nil, f.call("Keys.List") }

func (f *fake) GC(context.Context, *time.Duration, *time.Duration) (retention.Result, error) {
	return retention.Result{}, f.call("GC")
}
func (f *fake) Subscribe() (<-chan events.Event, func()) {
	ch := make(chan events.Event)
	close(ch)
	return ch, func() {}
}
func (f *fake) Failed(op, code string) {}

func (f *fake) Migrate(context.Context, string, record.Address) error { return f.call("Migrate") }
func (f *fake) Adopt(context.Context, string) error                   { return f.call("Adopt") }
func (f *fake) Drain(context.Context, []record.Address, int) ([]drain.Outcome, error) {
	return nil, f.call("Drain")
}
func (f *fake) Receive(context.Context, record.Address, member.Handed) error {
	return f.call("Receive")
}
func (f *fake) Serves(record.Address) error                       { return f.call("Serves") }
func (f *fake) ServesObject(record.Address, record.Address) error { return f.call("ServesObject") }
func (f *fake) ServesRecord(record.Address, string) error         { return f.call("ServesRecord") }
func (f *fake) Owing(string) (bool, error)                        { return false, nil }
func (f *fake) Done(record.Address, member.Handed) error          { return f.call("Done") }
func (f *fake) Held(record.Address, member.Handed) (bool, error)  { return true, f.call("Held") }
func (f *fake) Expect(context.Context, record.Address, record.Address) error {
	return f.call("Expect")
}

// fakeKeys is the fake as the trusted-key set (its List clashes with the
// daemon's).
type fakeKeys struct{ *fake }

func (k fakeKeys) List() ([]trust.Key, error) { return k.List2() }

// operator is the operator's API over f and a real store holding run "r"
// (a unit spec and grant set, no segments).
func operator(t *testing.T, f *fake) http.Handler {
	t.Helper()
	st := testhost.New(t, "").Store
	spec := unit.Spec{Image: "example/unit:1", ImageDigest: "sha256:" + strings.Repeat("ab", 32), Args: []string{"/unit"},
		Mode: unit.ImageMode, Nonce: strings.Repeat("0f", 16)}
	grants := unit.Grants{MilliCPU: 500, MemoryBytes: 64 << 20, Network: unit.NoNetwork}
	sb, err := spec.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	gb, err := grants.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	ua, err := st.PutBytes(sb)
	if err != nil {
		t.Fatal(err)
	}
	ga, err := st.PutBytes(gb)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Create("r", ua, ga); err != nil {
		t.Fatal(err)
	}
	return New(Deps{Daemon: f, Store: st, Keys: fakeKeys{f}, Collector: f, Events: f, Counts: f, Fleet: f, Exporter: f, Placement: f,
		Metrics: http.NotFoundHandler()}, testhost.Log(t))
}

// A route, its request, and what the handler asks of its roles.
type routeCase struct {
	method, path, body string
	calls              string // the role calls a success makes, in order
}

// Every operator route answers 200 when its roles succeed, with the
// calls it makes; and each error its roles can refuse with reaches the
// client as its code and status (errors.go), with nothing else asked.
func TestHandlers(t *testing.T) {
	host := record.Sum([]byte("peer")).String()
	routes := map[string]routeCase{
		"host":        {"GET", "/v1/host", "", "Host"},
		"image":       {"POST", "/v1/images?name=img", "tar", "ImportImage"},
		"start":       {"POST", "/v1/runs", `{"id":"n","unit":{"image":"img"}}`, "StartBooked"},
		"list":        {"GET", "/v1/runs", "", "List"},
		"show":        {"GET", "/v1/runs/r", "", "Run"},
		"park":        {"POST", "/v1/runs/r/park", "", "Park"},
		"resume":      {"POST", "/v1/runs/r/resume", "", "Resume"},
		"close":       {"POST", "/v1/runs/r/close", `{"reason":"done"}`, "Close"},
		"migrate":     {"POST", "/v1/runs/r/migrate", `{"to":"` + host + `"}`, "Migrate Run"},
		"drain":       {"POST", "/v1/drain", `{}`, "Drain"},
		"park-all":    {"POST", "/v1/park-all", `{}`, "ParkAll"},
		"adopt":       {"POST", "/v1/runs/r/adopt", "", "Adopt Run"},
		"verify":      {"GET", "/v1/runs/r/verify", "", "Verify"},
		"wait-proof":  {"GET", "/v1/runs/r/wait-proof", "", ""},
		"record":      {"GET", "/v1/runs/r/record", "", ""},
		"export":      {"GET", "/v1/runs/r/export", "", "Exportable Export"},
		"logs":        {"GET", "/v1/runs/r/logs", "", "Run Logs"},
		"import":      {"POST", "/v1/import", "tar", "ImportWith"},
		"gc":          {"POST", "/v1/gc", `{}`, "GC"},
		"pin":         {"POST", "/v1/runs/r/pin", "", "Pin"},
		"unpin":       {"DELETE", "/v1/runs/r/pin", "", "Pin"},
		"trust-list":  {"GET", "/v1/trust", "", "Keys.List"},
		"trust-add":   {"POST", "/v1/trust", `{"key":"` + host + `","name":"peer"}`, "Add"},
		"trust-rm":    {"DELETE", "/v1/trust/" + host, "", "Remove"},
		"calls":       {"GET", "/v1/calls", "", ""},
		"post-result": {"POST", "/v1/runs/r/calls/c1/result", `{}`, "PostResult"},
	}
	for name, rc := range routes {
		t.Run(name+"/ok", func(t *testing.T) {
			f := &fake{}
			w := serve(t, operator(t, f), rc)
			if w.Code != http.StatusOK {
				t.Fatalf("status %d, want 200: %s", w.Code, w.Body)
			}
			if got := strings.Join(f.calls, " "); got != rc.calls {
				t.Errorf("calls %q, want %q", got, rc.calls)
			}
		})
	}

	// The refusals each route's roles can answer with, by the code the
	// client sees.
	refusals := map[string][]error{
		"image":       {executor.ErrInvalid, executor.ErrExists},
		"start":       {store.ErrRunExists, unit.ErrInvalid, answers.ErrStopping, imageparks.ErrUnavailable, park.ErrNoSpace, secrets.ErrNoSpace},
		"list":        {store.ErrDamaged},
		"park":        {store.ErrNoRun, record.ErrParked, executor.ErrCheckpoint, executor.ErrCheckpointTimeout, park.ErrNoSpace, imageparks.ErrUnavailable, store.ErrHandedOff, answers.ErrNoSandbox},
		"resume":      {store.ErrNoRun, record.ErrNotParked, &resume.SnapshotError{}, &resume.ManifestError{}, &resume.RecordError{Err: errors.New("x")}, executor.ErrRestore, executor.ErrRestoreTimeout, answers.ErrStopping, store.ErrHandedOff, secrets.ErrNoSpace, secrets.ErrRequired},
		"close":       {store.ErrNoRun, record.ErrClosed, store.ErrHandedOff},
		"migrate":     {store.ErrNoRun, member.ErrNoFleet, member.ErrDraining},
		"drain":       {member.ErrNoFleet},
		"park-all":    {answers.ErrStopping},
		"adopt":       {store.ErrNoRun, member.ErrNoFleet},
		"verify":      {store.ErrNoRun},
		"export":      {store.ErrNoRun, store.ErrHandedOff, bundle.ErrResultsHeld},
		"logs":        {store.ErrNoRun},
		"import":      {bundle.ErrMalformed, bundle.ErrLimit, bundle.ErrPolicy, &attest.UntrustedError{}, store.ErrGenesisHeld, store.ErrRunExists},
		"gc":          {store.ErrClosed},
		"pin":         {store.ErrNoRun},
		"unpin":       {store.ErrNoRun},
		"trust-list":  {store.ErrClosed},
		"trust-add":   {trust.ErrKey},
		"trust-rm":    {trust.ErrKey, store.ErrNotTrusted},
		"post-result": {store.ErrNoRun, store.ErrUnknownCall, store.ErrResultPosted, record.ErrClosed},
	}
	for name, errs := range refusals {
		for _, refusal := range errs {
			rc := routes[name]
			want := ErrorOf(refusal).Code
			t.Run(fmt.Sprintf("%s/%s", name, want), func(t *testing.T) {
				f := &fake{err: refusal}
				w := serve(t, operator(t, f), rc)
				var e api.Error
				if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil {
					t.Fatalf("status %d, body %q: %v", w.Code, w.Body, err)
				}
				if e.Code != want || w.Code != Status(want) {
					t.Errorf("%v: code %q status %d, want %q %d", refusal, e.Code, w.Code, want, Status(want))
				}
				if len(f.calls) != 1 {
					t.Errorf("calls %q after the first refused: want that one only", f.calls)
				}
			})
		}
	}
}

// The evidence routes read the store: a run it does not hold is
// not_found, a malformed body bad_request, without asking the daemon.
func TestHandlersRefuseBeforeTheDaemon(t *testing.T) {
	for _, c := range []struct {
		rc   routeCase
		code string
	}{
		{routeCase{"GET", "/v1/runs/nope/record", "", ""}, api.CodeNotFound},
		{routeCase{"GET", "/v1/runs/nope/wait-proof", "", ""}, api.CodeNotFound},
		{routeCase{"GET", "/v1/runs/nope", "", ""}, api.CodeNotFound},
		{routeCase{"POST", "/v1/runs", `{"id":`, ""}, api.CodeBadRequest},
		{routeCase{"POST", "/v1/runs", `{"stray":1}`, ""}, api.CodeBadRequest},
		{routeCase{"GET", "/v1/runs?phase=sleeping", "", ""}, api.CodeBadRequest},
		{routeCase{"POST", "/v1/runs/r/close", `{"reason":`, ""}, api.CodeBadRequest},
		{routeCase{"POST", "/v1/runs/r/migrate", `{"to":"not a key"}`, ""}, api.CodeBadRequest},
		{routeCase{"POST", "/v1/drain", `{"parallel":65}`, ""}, api.CodeBadRequest},
		{routeCase{"POST", "/v1/park-all", `{"parallel":-1}`, ""}, api.CodeBadRequest},
		{routeCase{"POST", "/v1/gc", `{"retention_ns":`, ""}, api.CodeBadRequest},
		{routeCase{"POST", "/v1/trust", `[]`, ""}, api.CodeBadRequest},
		{routeCase{"GET", "/v1/runs/r/logs?tail=-1", "", ""}, api.CodeBadRequest},
	} {
		t.Run(c.rc.method+" "+c.rc.path, func(t *testing.T) {
			f := &fake{}
			w := serve(t, operator(t, f), c.rc)
			var e api.Error
			if err := json.Unmarshal(w.Body.Bytes(), &e); err != nil || e.Code != c.code {
				t.Fatalf("status %d, body %q; want %s", w.Code, w.Body, c.code)
			}
			for _, call := range f.calls {
				if call != "Run" && call != "Host" {
					t.Errorf("the daemon was asked %s", call)
				}
			}
		})
	}
}

func serve(t *testing.T, h http.Handler, rc routeCase) *httptest.ResponseRecorder {
	t.Helper()
	var body io.Reader
	if rc.body != "" {
		body = strings.NewReader(rc.body)
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(rc.method, rc.path, body))
	return w
}

package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/runrecordd/runrecordd/internal/fleet/peer"
	"github.com/runrecordd/runrecordd/internal/platform"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// Role is whom a route table serves: the operator on the root unix
// socket, or a platform key on the fleet's mutual-TLS listener. (Host
// keys there get the peer routes, PeerRoutes.)
type Role string

// The roles of the client API.
const (
	Operator Role = "operator"
	Platform Role = "platform"
)

// gate is what a platform key's request of a route is held to.
type gate int

const (
	refused  gate = iota // never served to a platform key: 403 forbidden
	owned                // the run {id} must be one the key started: else 404 not_found
	starts               // a new run, under the key's quotas and mount policy, booked to it
	filtered             // answers only what concerns the key's runs
	allowed              // served as to the operator: it concerns no run (the API's description)
)

// String is the gate as docs/fleet.md's route table names it.
func (g gate) String() string {
	return [...]string{refused: "refused", owned: "its runs", starts: "new run", filtered: "its runs only", allowed: "allowed"}[g]
}

// route is one route of the client API: every one serves the operator;
// platform says what a platform key is held to.
type route struct {
	pattern  string
	serve    func(h *handler, w http.ResponseWriter, r *http.Request)
	platform gate
}

// routes is the client API, the one table of it: docs/fleet.md, "Roles",
// is its reference, and TestRouteTableDoc holds the two together.
var routes = []route{
	{"GET /v1/host", (*handler).host, refused},
	{"POST /v1/images", (*handler).importImage, refused},
	{"POST /v1/runs", (*handler).start, starts},
	{"GET /v1/runs", (*handler).list, filtered},
	{"GET /v1/runs/{id}", (*handler).show, owned},
	{"POST /v1/runs/{id}/park", (*handler).park, owned},
	{"POST /v1/runs/{id}/resume", (*handler).resume, owned},
	{"POST /v1/runs/{id}/close", (*handler).close, owned},
	{"POST /v1/runs/{id}/migrate", (*handler).migrate, refused},
	{"POST /v1/drain", (*handler).drain, refused},
	{"POST /v1/park-all", (*handler).parkAll, refused},
	{"POST /v1/runs/{id}/adopt", (*handler).adopt, refused},
	{"GET /v1/runs/{id}/verify", (*handler).verify, owned},
	{"GET /v1/runs/{id}/wait-proof", (*handler).waitProof, owned},
	{"GET /v1/runs/{id}/record", (*handler).record, refused},
	{"GET /v1/runs/{id}/export", (*handler).export, refused},
	{"GET /v1/runs/{id}/logs", (*handler).logs, owned},
	{"POST /v1/import", (*handler).importBundle, refused},
	{"POST /v1/gc", (*handler).gc, refused},
	{"POST /v1/runs/{id}/pin", (*handler).pin, refused},
	{"DELETE /v1/runs/{id}/pin", (*handler).pin, refused},
	{"GET /v1/trust", (*handler).trustList, refused},
	{"POST /v1/trust", (*handler).trustAdd, refused},
	{"DELETE /v1/trust/{key}", (*handler).trustRemove, refused},
	{"GET /v1/calls", (*handler).calls, filtered},
	{"POST /v1/runs/{id}/calls/{call}/result", (*handler).postResult, owned},
	{"GET /v1/events", (*handler).events, filtered},
	{"GET /metrics", (*handler).metrics, refused},
	{"GET /v1/openapi.json", (*handler).openAPI, allowed},
}

// Routes are the patterns role is served, in the table's order.
func Routes(role Role) []string {
	var out []string
	for _, rt := range routes {
		if role == Operator || rt.platform != refused {
			out = append(out, rt.pattern)
		}
	}
	return out
}

// New returns the operator's API handler, every route of the table: /v1
// (pkg/api documents the bodies) and /metrics. It is served on the root
// unix socket only.
func New(deps Deps, log *slog.Logger) http.Handler {
	h := newHandler(deps, log)
	return h.logged(h.mux(Operator, routes, nil))
}

// Tenancy is what the platform keys' API holds them to: who started which
// run here, their quotas, and their mount policy.
type Tenancy struct {
	Books  *platform.Books
	Limits platform.Limits
}

// NewPlatform returns the client API as platform keys get it on the
// fleet's mutual-TLS listener (docs/fleet.md, "Roles"): the routes the
// table gives them, each held to its gate; every other route answers 403
// forbidden. The key is the one its connection's handshake established
// (peer.KeyOf), as a platform.
//
// A book whose run does not exist (a crash between a start's book and its
// genesis) is dropped first, so it never hands a later run of that id to
// its key.
func NewPlatform(deps Deps, t Tenancy, log *slog.Logger) http.Handler {
	h := newHandler(deps, log)
	if err := t.Books.Prune(func(run string) bool { _, err := deps.Daemon.Run(run); return !errors.Is(err, store.ErrNoRun) }); err != nil {
		h.log.Error("platform books of runs that do not exist", "err", err)
	}
	h.tenancy = &t
	h.policy = t.Limits.Policy(deps.Daemon.Host().StateDir)
	return h.logged(peer.Require(fleetPlatform, h.mux(Platform, routes, platformKey)))
}

// platformKey is the platform key of r's connection.
func platformKey(r *http.Request) (record.Address, bool) {
	key, role, ok := peer.KeyOf(r)
	return key, ok && role == fleetPlatform
}

func newHandler(deps Deps, log *slog.Logger) *handler {
	if log == nil {
		log = slog.Default()
	}
	return &handler{Deps: deps, d: deps.Daemon, log: log}
}

// mux serves role the routes of table (routes; tests give their own);
// keyOf, for the platform role, is the key a request comes with.
func (h *handler) mux(role Role, table []route, keyOf func(*http.Request) (record.Address, bool)) *http.ServeMux {
	mux := http.NewServeMux()
	for _, rt := range table {
		serve := func(w http.ResponseWriter, r *http.Request) { rt.serve(h, w, r) }
		if role == Platform {
			serve = h.gated(rt, keyOf)
		}
		mux.HandleFunc(rt.pattern, serve)
	}
	if role == Platform {
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { forbidden(w, r) })
	}
	return mux
}

// gated is rt as a platform key gets it.
func (h *handler) gated(rt route, keyOf func(*http.Request) (record.Address, bool)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		key, ok := keyOf(r)
		if !ok || rt.platform == refused {
			forbidden(w, r)
			return
		}
		if id := r.PathValue("id"); rt.platform == owned && !h.tenancy.Books.Owns(key, id) {
			// As a run that does not exist: a platform key learns nothing
			// of runs it did not start.
			h.fail(w, r, fmt.Errorf("run %s: %w", id, errNoRun))
			return
		}
		// starts and filtered: the route's handler holds the request to
		// the key it carries (platformOf).
		rt.serve(h, w, r.WithContext(context.WithValue(r.Context(), platformCtx{}, key)))
	}
}

// platformCtx is the context key of a platform key's request.
type platformCtx struct{}

// platformOf is the platform key a gated request comes with, if any.
func platformOf(r *http.Request) (record.Address, bool) {
	key, ok := r.Context().Value(platformCtx{}).(record.Address)
	return key, ok
}

// keepOf is what a listing answers r: nil (everything) for the operator,
// the runs the key started for a platform key.
func (h *handler) keepOf(r *http.Request) func(run string) bool {
	key, ok := platformOf(r)
	if !ok {
		return nil
	}
	return func(run string) bool { return h.tenancy.Books.Owns(key, run) }
}

func forbidden(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusForbidden, &api.Error{Code: api.CodeForbidden,
		Message: fmt.Sprintf("%s %s is not served to platform keys (docs/fleet.md, \"Roles\")", r.Method, r.URL.Path)})
}

func (h *handler) metrics(w http.ResponseWriter, r *http.Request) { h.Metrics.ServeHTTP(w, r) }

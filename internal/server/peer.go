package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/fleet/member"
	"github.com/runrecordd/runrecordd/internal/fleet/peer"
	"github.com/runrecordd/runrecordd/internal/fleet/transfer"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// The fleet's peer routes, served to admitted host keys on the mutual-TLS
// listener (docs/fleet.md, "Migration"); their client is peer.Hosts, and
// their bodies are peer's wire types.
//
//	GET  /v1/objects/{addr}   an object's bytes, or one Range of them
//	                          (internal/fleet/transfer),
//	                          to a host this one is handing a run to that
//	                          reaches the object (member.ServesObject)
//	POST /v1/objects/missing  which of a list this host lacks, to a host
//	                          this one is handing a run to, for objects
//	                          of that run only
//	GET  /v1/records/{id}     a run's record, wire form, to the host this
//	                          one is handing the run to
//	                          (member.ServesRecord)
//	POST /v1/migrations       peer.Migration: take the run the calling host
//	                          handed to this one, once the directory says
//	                          so (member.Receive; resumed when asked);
//	                          answers the run as held here, and
//	                          whether it owes slabs (post-copy)
//	POST /v1/migrations/done  peer.Done: the calling host, a post-copy
//	                          target, holds every object of the run, or
//	                          needs none: its hold here ends (member.Done)
//	POST /v1/migrations/held  peer.Held: whether this host still holds
//	                          the run for the calling host (member.Held;
//	                          false for a hold not the caller's)
//	POST /v1/migrations/expect peer.Expected: the calling host says it
//	                          is about to hand the run here; from its
//	                          owner, a record of it held here is rehashed
//	                          meanwhile (member.Expect)
//	POST /v1/placement        peer.OfferRequest: what this host can take
//	                          now (Deps.Placement), before a drain
//
// A refusal of the directory or of the transfers served is 403
// (forbidden), as a key whose role may not use the route.

// PeerRoutes are the patterns of the peer routes, which the mutual-TLS
// listener serves to host keys only (everything else there is the client
// API, for platform keys).
var PeerRoutes = []string{"/v1/objects/", "/v1/records/", "/v1/migrations", "/v1/migrations/done", "/v1/migrations/held", "/v1/migrations/expect", "/v1/placement"}

// Peer is the peer routes' handler; the caller admits host keys only
// (peer.Require), and the calling host is the one its key names.
func Peer(deps Deps, log *slog.Logger) http.Handler {
	h := newHandler(deps, log)
	mux := http.NewServeMux()
	objects := deps.Objects
	mux.HandleFunc("GET /v1/objects/{addr}", func(w http.ResponseWriter, r *http.Request) {
		a, err := record.ParseAddress(r.PathValue("addr"))
		if err == nil {
			err = served(r, func(key record.Address) error { return h.Fleet.ServesObject(key, a) })
		}
		if err != nil {
			h.fail(w, r, err)
			return
		}
		objects.ServeHTTP(w, r)
	})
	mux.HandleFunc("POST /v1/objects/missing", func(w http.ResponseWriter, r *http.Request) {
		if err := servedMissing(r, h.Fleet); err != nil {
			h.fail(w, r, err)
			return
		}
		objects.ServeHTTP(w, r)
	})
	mux.HandleFunc("GET /v1/records/{id}", func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if err := served(r, func(key record.Address) error { return h.Fleet.ServesRecord(key, id) }); err != nil {
			h.fail(w, r, err)
			return
		}
		h.record(w, r)
	})
	mux.HandleFunc("POST /v1/migrations", h.receive)
	mux.HandleFunc("POST /v1/migrations/done", h.migrated)
	mux.HandleFunc("POST /v1/migrations/held", h.stillHeld)
	mux.HandleFunc("POST /v1/migrations/expect", h.expect)
	mux.HandleFunc("POST /v1/placement", h.offer)
	return mux
}

// servedMissing checks a POST /v1/objects/missing before it is answered:
// the calling host has a transfer served to it, and every address it asks
// about is an object of one (member.ServesObject), so that the answer
// tells nothing of any other object. The body is read, bounded, and given
// back to r for the objects' handler, which judges its form.
func servedMissing(r *http.Request, f Fleet) error {
	if err := served(r, f.Serves); err != nil {
		return err
	}
	b, err := io.ReadAll(io.LimitReader(r.Body, transfer.MaxMissingBody+1))
	if err != nil {
		return fmt.Errorf("%w: %w", answers.ErrInvalid, err)
	}
	r.Body = io.NopCloser(bytes.NewReader(b))
	var q transfer.MissingRequest
	if json.Unmarshal(b, &q) != nil {
		return nil // malformed or too long: refused by the handler
	}
	for _, a := range q.Objects {
		if err := served(r, func(key record.Address) error { return f.ServesObject(key, a) }); err != nil {
			return err
		}
	}
	return nil
}

// served asks serves whether the calling host (its verified key) may read
// what it asks for.
func served(r *http.Request, serves func(key record.Address) error) error {
	key, _, ok := peer.KeyOf(r)
	if !ok {
		return fmt.Errorf("%w: no verified host key", member.ErrUnsolicited)
	}
	return serves(key)
}

func (h *handler) offer(w http.ResponseWriter, r *http.Request) {
	var q peer.OfferRequest
	if err := decode(w, r, &q); err != nil {
		h.fail(w, r, err)
		return
	}
	if len(q.Images) > peer.MaxOfferImages {
		h.fail(w, r, fmt.Errorf("%w: %d image names, at most %d", answers.ErrInvalid, len(q.Images), peer.MaxOfferImages))
		return
	}
	o, err := h.Placement.Offer(r.Context(), q.Images)
	a := peer.OfferAnswer{Facts: o.Facts, Images: o.Images, Free: o.Free, Draining: o.Draining, ImageParks: o.ImageParks, EgressNames: o.EgressNames, PostCopy: o.PostCopy}
	for _, p := range o.EgressAllow {
		a.EgressAllow = append(a.EgressAllow, p.String())
	}
	h.reply(w, r, a, err)
}

// hostCall is the calling host's verified key, and r's body decoded into
// v; ok false when either failed, answered already (forbidden, or the
// decoding's error).
func (h *handler) hostCall(w http.ResponseWriter, r *http.Request, v any) (from record.Address, ok bool) {
	from, _, ok = peer.KeyOf(r)
	if !ok {
		writeJSON(w, http.StatusForbidden, &api.Error{Code: api.CodeForbidden, Message: "no verified host key"})
		return from, false
	}
	if err := decode(w, r, v); err != nil {
		h.fail(w, r, err)
		return from, false
	}
	return from, true
}

func (h *handler) receive(w http.ResponseWriter, r *http.Request) {
	var m peer.Migration
	from, ok := h.hostCall(w, r, &m)
	if !ok {
		return
	}
	if err := h.Fleet.Receive(r.Context(), from, member.Handed{Run: m.Run, Genesis: m.Genesis, Head: m.Head, Resume: m.Resume, Held: m.Held}); err != nil {
		h.fail(w, r, err)
		return
	}
	run, err := h.d.Run(m.Run)
	owing, oerr := h.Fleet.Owing(m.Run)
	h.reply(w, r, peer.Handed{Run: runOf(run), Owing: owing}, errors.Join(err, oerr))
}

func (h *handler) migrated(w http.ResponseWriter, r *http.Request) {
	var d peer.Done
	from, ok := h.hostCall(w, r, &d)
	if !ok {
		return
	}
	h.reply(w, r, struct{}{}, h.Fleet.Done(from, member.Handed{Run: d.Run, Genesis: d.Genesis, Head: d.Head}))
}

func (h *handler) expect(w http.ResponseWriter, r *http.Request) {
	var q peer.Expected
	from, ok := h.hostCall(w, r, &q)
	if !ok {
		return
	}
	if q.Genesis.IsZero() {
		h.fail(w, r, fmt.Errorf("%w: no genesis", answers.ErrInvalid))
		return
	}
	h.reply(w, r, struct{}{}, h.Fleet.Expect(r.Context(), from, q.Genesis))
}

func (h *handler) stillHeld(w http.ResponseWriter, r *http.Request) {
	var q peer.Held
	from, ok := h.hostCall(w, r, &q)
	if !ok {
		return
	}
	held, err := h.Fleet.Held(from, member.Handed{Run: q.Run, Genesis: q.Genesis, Head: q.Head})
	h.reply(w, r, peer.HeldAnswer{Held: held}, err)
}

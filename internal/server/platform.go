package server

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/fleet"
	"github.com/runrecordd/runrecordd/internal/platform"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// fleetPlatform is the directory's role of a platform key.
const fleetPlatform = fleet.RolePlatform

// errNoRun is the refusal of a run a platform key did not start: the
// store's own, so that it reads as a run that does not exist.
var errNoRun = store.ErrNoRun

// platformStart starts a run for key: its grants judged by the platform's
// policy, its quotas counted, then the run booked to key and started —
// one start of a key at a time, so that two cannot pass one quota.
func (h *handler) platformStart(w http.ResponseWriter, r *http.Request, key record.Address, req api.RunRequest) {
	done := h.tenancy.Books.Starting(key)
	defer done()
	held, err := h.held(key)
	if err == nil {
		err = h.tenancy.Limits.Check(h.policy, req.Grants, held)
	}
	if err != nil {
		h.fail(w, r, fmt.Errorf("run: platform key %s: %w", key, err))
		return
	}
	run, err := h.d.StartBooked(r.Context(), req.ID, req.Unit, req.Grants, answers.Starting{Booking: booking{h.tenancy.Books, key}, Secrets: req.Secrets})
	h.reply(w, r, runOf(run), err)
}

// booking books a run to key before it starts (answers.Booking), so that
// key's event stream tells it the run's run.started.
type booking struct {
	books *platform.Books
	key   record.Address
}

func (b booking) Book(run string) error   { return b.books.Keep(run, b.key) }
func (b booking) Unbook(run string) error { return b.books.Drop(run) }

// held is what key's runs hold here now, as its quotas count it.
func (h *handler) held(key record.Address) (platform.Held, error) {
	var held platform.Held
	var here []answers.Summary
	for _, id := range h.tenancy.Books.Runs(key) {
		s, err := h.d.Run(id)
		if errors.Is(err, store.ErrNoRun) {
			continue
		}
		if err != nil {
			return held, err
		}
		if s.HandedOff {
			continue
		}
		here = append(here, s)
		if s.Phase != record.PhaseClosed {
			held.Runs++
		}
	}
	n, err := h.d.StoredBytes(here)
	held.StoreBytes = n
	return held, err
}

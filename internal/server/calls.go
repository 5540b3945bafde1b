package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/calls"
)

// The platform's side of outward calls: the pending calls, posting a
// result, and the stream of transitions.

func (h *handler) calls(w http.ResponseWriter, r *http.Request) {
	cs, err := calls.List(h.Store)
	if keep := h.keepOf(r); keep != nil {
		cs = slices.DeleteFunc(cs, func(c calls.Listed) bool { return !keep(c.Run) })
	}
	h.reply(w, r, callsOf(cs), err)
}

func (h *handler) postResult(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJSON))
	if err != nil {
		h.fail(w, r, fmt.Errorf("%w: result body: %w", answers.ErrInvalid, err))
		return
	}
	res, err := h.d.PostResult(r.Context(), r.PathValue("id"), r.PathValue("call"), b)
	h.reply(w, r, postedOf(res), err)
}

// events streams transitions as JSON lines until the client goes away: a
// platform key only those of the runs it started.
func (h *handler) events(w http.ResponseWriter, r *http.Request) {
	keep := h.keepOf(r)
	ch, done := h.Events.Subscribe()
	defer done()
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	flush := func() {
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
	}
	flush()
	enc := json.NewEncoder(w)
	for {
		select {
		case <-r.Context().Done():
			return
		case e, ok := <-ch:
			if !ok {
				return // the daemon is stopping
			}
			if keep != nil && (e.Run == "" || !keep(e.Run)) {
				continue
			}
			if enc.Encode(eventOf(e)) != nil {
				return
			}
			flush()
		}
	}
}

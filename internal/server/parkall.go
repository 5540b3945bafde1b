package server

import (
	"fmt"
	"net/http"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/pkg/api"
)

func (h *handler) parkAll(w http.ResponseWriter, r *http.Request) {
	var req api.ParkAllRequest
	if r.ContentLength != 0 {
		if err := decode(w, r, &req); err != nil {
			h.fail(w, r, err)
			return
		}
	}
	if req.Parallel < 0 || req.Parallel > 64 {
		h.fail(w, r, fmt.Errorf("%w: parallel %d: use 1 to 64, or 0 for the default", answers.ErrInvalid, req.Parallel))
		return
	}
	runs, err := h.d.ParkAll(r.Context(), req.Parallel)
	h.reply(w, r, parkAllOf(runs), err)
}

func parkAllOf(rs []answers.Each[answers.Parked]) api.ParkAll {
	out := api.ParkAll{Runs: make([]api.ParkedRun, 0, len(rs))}
	for _, r := range rs {
		p := api.ParkedRun{Run: r.Run}
		if r.Answer != nil {
			pk := parkOf(*r.Answer)
			p.Park = &pk
			out.Parked++
		} else {
			out.Left++
		}
		if r.Err != nil {
			p.Error = ErrorOf(r.Err)
		}
		out.Runs = append(out.Runs, p)
	}
	return out
}

package api

import (
	"context"
	"net/http"
)

// ParkAllRequest parks every run executing on the daemon's host (POST
// /v1/park-all, on the daemon's socket only), Parallel at a time (4 when
// 0). Each parked run is resumed by the daemon's next start.
type ParkAllRequest struct {
	Parallel int `json:"parallel,omitempty"`
}

// ParkAll is the outcome of a park of every executing run: each run, its
// park or why it goes on executing.
type ParkAll struct {
	Runs   []ParkedRun `json:"runs"`
	Parked int         `json:"parked"`
	Left   int         `json:"left"` // runs still executing: not parked
}

// ParkedRun is one run of a ParkAll. Park is set when the run was parked;
// Error too when it was parked but not listed for the next start.
type ParkedRun struct {
	Run   string `json:"run"`
	Park  *Park  `json:"park,omitempty"`
	Error *Error `json:"error,omitempty"`
}

// ParkAll parks every run executing on the daemon's host.
func (c *Client) ParkAll(ctx context.Context, req ParkAllRequest) (ParkAll, error) {
	var p ParkAll
	err := c.Do(ctx, http.MethodPost, "/v1/park-all", req, &p)
	return p, err
}

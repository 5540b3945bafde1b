package transfer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/api"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// MaxMissing is the most addresses one POST /v1/objects/missing may ask
// about. [Missing] asks in batches of it.
const MaxMissing = 1 << 16

// MaxMissingBody bounds the request body of POST /v1/objects/missing: an
// address is 46 characters, quoted and separated by a comma (49 bytes),
// and a little room for the object around them.
const MaxMissingBody = MaxMissing*50 + 1024

// MissingRequest is the body of POST /v1/objects/missing.
type MissingRequest struct {
	Objects []record.Address `json:"objects"`
}

// MissingResponse is its answer: the addresses of the request that the
// store does not hold, in the request's order, each once.
type MissingResponse struct {
	Missing []record.Address `json:"missing"`
}

// Handler serves a store's objects to a peer:
//
//   - GET /v1/objects/{addr}: the object's bytes, with Content-Length,
//     read verified; with a Range header of one range (bytes=FIRST-LAST,
//     at most [MaxRange] bytes), 206 and those bytes, not verified
//     ([ReadRange] verifies them); 404 with an [api.Error] (not_found) when the store
//     does not hold it, 400 (bad_request) for a malformed address
//     ([record.ParseAddress]). An object found
//     corrupt as it is sent is cut off (the connection is aborted, not
//     ended): the peer gets an error, or bytes that fail its hash check.
//   - POST /v1/objects/missing: a [MissingRequest] in, a
//     [MissingResponse] out; at most [MaxMissing] addresses (413 beyond).
//
// It does not judge who asks: the caller wraps it in its own
// authentication (internal/fleet/peer admits only host keys).
func Handler(st *store.Store) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/objects/{addr}", func(w http.ResponseWriter, r *http.Request) { serveObject(st, w, r) })
	mux.HandleFunc("POST /v1/objects/missing", func(w http.ResponseWriter, r *http.Request) { serveMissing(st, w, r) })
	return mux
}

func serveObject(st *store.Store, w http.ResponseWriter, r *http.Request) {
	// ParseAddress is strict: one spelling per address.
	a, err := record.ParseAddress(r.PathValue("addr"))
	if err != nil {
		writeError(w, http.StatusBadRequest, api.CodeBadRequest, err)
		return
	}
	if spec := r.Header.Get("Range"); spec != "" {
		serveRange(st, w, a, spec)
		return
	}
	rd, err := st.Open(a)
	if errors.Is(err, store.ErrMissingObject) {
		writeError(w, http.StatusNotFound, api.CodeNotFound, err)
		return
	}
	if err != nil {
		writeError(w, http.StatusInternalServerError, api.CodeInternal, err)
		return
	}
	defer rd.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(rd.Size(), 10))
	w.WriteHeader(http.StatusOK)
	if _, err := io.Copy(w, rd); err != nil {
		// Corrupt bytes, or a peer gone: the response cannot be taken
		// back, so it is cut off rather than ended.
		panic(http.ErrAbortHandler)
	}
}

func serveMissing(st *store.Store, w http.ResponseWriter, r *http.Request) {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, MaxMissingBody))
	dec.DisallowUnknownFields()
	var req MissingRequest
	err := dec.Decode(&req)
	if err == nil && dec.More() {
		err = errors.New("trailing data after the request")
	}
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		writeError(w, http.StatusRequestEntityTooLarge, api.CodeBadRequest, fmt.Errorf("request over %d bytes", tooBig.Limit))
		return
	case err != nil:
		writeError(w, http.StatusBadRequest, api.CodeBadRequest, err)
		return
	case len(req.Objects) > MaxMissing:
		writeError(w, http.StatusRequestEntityTooLarge, api.CodeBadRequest, fmt.Errorf("%d addresses, the limit is %d", len(req.Objects), MaxMissing))
		return
	}
	resp := MissingResponse{Missing: []record.Address{}}
	seen := make(map[record.Address]bool, len(req.Objects))
	for _, a := range req.Objects {
		if !seen[a] && !st.Has(a) {
			resp.Missing = append(resp.Missing, a)
		}
		seen[a] = true
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(resp)
}

func writeError(w http.ResponseWriter, status int, code string, err error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(api.Error{Code: code, Message: err.Error()})
}

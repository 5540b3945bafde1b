package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/runrecordd/runrecordd/internal/answers"
	"github.com/runrecordd/runrecordd/internal/runlog"
	"github.com/runrecordd/runrecordd/pkg/api"
)

// logs streams a run's output as JSON lines (api.LogLine): GET
// /v1/runs/{id}/logs?follow=true&tail=N&since=T (docs/daemon.md).
func (h *handler) logs(w http.ResponseWriter, r *http.Request) {
	opt, err := logOptions(r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	id := r.PathValue("id")
	// Check first, so that an unknown run gets an error body.
	if _, err := h.d.Run(id); err != nil {
		h.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	opt.Flush = func() {
		if flusher != nil {
			flusher.Flush()
		}
	}
	enc := json.NewEncoder(w)
	err = h.d.Logs(r.Context(), id, opt, func(c runlog.Chunk) error { return enc.Encode(logLineOf(c)) })
	if err != nil && r.Context().Err() == nil {
		// The status is sent: the error is the stream's last line.
		_ = enc.Encode(api.LogLine{Error: ErrorOf(err)})
	}
	opt.Flush()
}

// logOptions reads the query: follow (a boolean), tail (a count of lines)
// and since (an RFC 3339 time, or a duration back from now).
func logOptions(r *http.Request) (runlog.Options, error) {
	q := r.URL.Query()
	opt := runlog.Options{Tail: -1}
	if v := q.Get("follow"); v != "" {
		f, err := strconv.ParseBool(v)
		if err != nil {
			return opt, fmt.Errorf("%w: follow %q: use true or false", answers.ErrInvalid, v)
		}
		opt.Follow = f
	}
	if v := q.Get("tail"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return opt, fmt.Errorf("%w: tail %q: use a count of lines", answers.ErrInvalid, v)
		}
		opt.Tail = n
	}
	if v := q.Get("since"); v != "" {
		t, err := since(v, time.Now())
		if err != nil {
			return opt, fmt.Errorf("%w: since %q: use an RFC 3339 time or a duration such as 10m", answers.ErrInvalid, v)
		}
		opt.Since = t
	}
	return opt, nil
}

// since is the instant v names: an RFC 3339 time, or a duration before now.
func since(v string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("not a time")
	}
	return now.Add(-d), nil
}

func logLineOf(c runlog.Chunk) api.LogLine {
	t := time.Unix(0, c.AtNS).UTC()
	l := api.LogLine{Interval: c.Interval, Stream: runlog.StreamName(c.Stream), Time: &t, Omitted: c.Omitted, Reason: c.Reason}
	if utf8.Valid(c.Data) {
		l.Text = string(c.Data)
	} else {
		l.Base64 = c.Data
	}
	return l
}

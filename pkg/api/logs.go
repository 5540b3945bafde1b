package api

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// LogLine is one JSON line of GET /v1/runs/{id}/logs: a line of a run's
// output (or a piece of one: a line that does not end in a newline goes
// on in the next of its interval and stream), a mark of output left out,
// or, last, an error that ended the stream.
type LogLine struct {
	Interval uint64 `json:"interval,omitempty"` // 1 for the run's first interval
	Stream   string `json:"stream,omitempty"`   // stdout or stderr
	// Time is when the output was recorded: its interval's end for a
	// sealed interval, when the daemon read it for the open one.
	Time *time.Time `json:"time,omitempty"`
	// Text is the bytes when they are UTF-8; Base64 holds them otherwise.
	Text   string `json:"text,omitempty"`
	Base64 []byte `json:"base64,omitempty"`
	// Omitted bytes of the stream were left out here, for Reason:
	// "journal-cap" (the interval's journal keeps its last 16 MiB of a
	// stream) or "log-limit" (the sandbox discarded them past the unit's
	// log limit).
	Omitted int64  `json:"omitted,omitempty"`
	Reason  string `json:"reason,omitempty"`
	// Error ended the stream after its status was sent.
	Error *Error `json:"error,omitempty"`
}

// Data is the line's bytes.
func (l LogLine) Data() []byte {
	if l.Base64 != nil {
		return l.Base64
	}
	return []byte(l.Text)
}

// LogOptions select a run's output (the query of GET /v1/runs/{id}/logs).
type LogOptions struct {
	Follow bool      // go on until the run is closed or handed off
	Tail   int       // the last Tail lines, when Tail >= 0 (TailAll: all)
	Since  time.Time // leave out sealed intervals' output recorded before it
}

// TailAll is LogOptions.Tail for the whole output.
const TailAll = -1

// Query is o as a query string.
func (o LogOptions) Query() string {
	q := url.Values{}
	if o.Follow {
		q.Set("follow", "true")
	}
	if o.Tail >= 0 {
		q.Set("tail", strconv.Itoa(o.Tail))
	}
	if !o.Since.IsZero() {
		q.Set("since", o.Since.UTC().Format(time.RFC3339Nano))
	}
	if len(q) == 0 {
		return ""
	}
	return "?" + q.Encode()
}

// Logs calls fn with each line of run id's output until the stream ends,
// ctx is done or fn returns false. An error line ends it with that error.
func (c *Client) Logs(ctx context.Context, id string, o LogOptions, fn func(LogLine) bool) error {
	pr, pw := io.Pipe()
	errc := make(chan error, 1)
	go func() {
		err := c.Do(ctx, http.MethodGet, RunPath(id, "/logs")+o.Query(), nil, pw)
		pw.CloseWithError(err)
		errc <- err
	}()
	defer pr.Close()
	dec := json.NewDecoder(pr)
	for {
		var l LogLine
		if err := dec.Decode(&l); err != nil {
			pr.Close()
			werr := <-errc
			switch {
			case err == io.EOF && werr == nil:
				return nil
			case ctx.Err() != nil:
				return ctx.Err()
			case werr != nil:
				return werr
			}
			return err
		}
		if l.Error != nil {
			return l.Error
		}
		if !fn(l) {
			return nil
		}
	}
}

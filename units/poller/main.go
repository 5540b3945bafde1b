// Command poller is the blocking shape of a transcript-mode unit: it
// dispatches one call (CALL_ID, default "call-1", of kind KIND, default
// "build") and then polls for its result every POLL_MS milliseconds
// (default 100) inside the same interval, holding its sandbox while it
// waits. When the result arrives it appends "result PAYLOAD" to the
// transcript and exits 0. Its record's wait proof is Blocked, naming the
// interval that consumed its own dispatch.
//
// The transcript is "dispatched CALL_ID" then "result PAYLOAD"; started
// again, the poller skips what the transcript records, so it never
// dispatches twice. RUNRECORDD_DIR names the protocol directory (default
// /run/runrecordd). Every action is one JSON line on stdout; a failure
// prints a line with "error" and exits 1.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/runrecordd/runrecordd/pkg/protocol"
)

// Line is one report on stdout.
type Line struct {
	Action   string          `json:"action"`
	Run      string          `json:"run,omitempty"`
	Interval int64           `json:"interval,omitempty"`
	ID       string          `json:"id,omitempty"`
	Polls    int             `json:"polls,omitempty"`
	Size     int64           `json:"size,omitempty"`
	Payload  json.RawMessage `json:"payload,omitempty"`
	Note     string          `json:"note,omitempty"`
	Error    string          `json:"error,omitempty"`
	Time     int64           `json:"time"`
}

func emit(l Line) {
	l.Time = time.Now().UnixMilli()
	b, _ := json.Marshal(l)
	os.Stdout.Write(append(b, '\n'))
}

func main() {
	if err := run(context.Background()); err != nil {
		emit(Line{Action: "error", Error: err.Error()})
		os.Exit(1)
	}
}

func run(ctx context.Context) error {
	id, kind, dir := env("CALL_ID", "call-1"), env("KIND", "build"), env("RUNRECORDD_DIR", protocol.Dir)
	poll, err := strconv.Atoi(env("POLL_MS", "100"))
	if err != nil || poll <= 0 {
		return fmt.Errorf("POLL_MS=%q: want milliseconds", os.Getenv("POLL_MS"))
	}

	c, err := protocol.Dial(filepath.Join(dir, protocol.SocketFile))
	if err != nil {
		return err
	}
	defer c.Close()
	hello, err := c.Hello(ctx)
	if err != nil {
		return err
	}
	emit(Line{Action: "hello", Run: hello.Run, Interval: hello.Interval})

	b, err := os.ReadFile(filepath.Join(dir, protocol.TranscriptFile))
	if err != nil {
		return err
	}
	transcript := string(b)
	if strings.Contains(transcript, "\nresult ") || strings.HasPrefix(transcript, "result ") {
		emit(Line{Action: "done", Note: "transcript has the result"})
		return nil
	}
	if !strings.Contains(transcript, "dispatched "+id+"\n") {
		err := c.Dispatch(ctx, protocol.Call{ID: id, Kind: kind, Payload: json.RawMessage(`{"poller":true}`)})
		if err != nil && !errors.Is(err, protocol.ErrDuplicateCall) {
			return err
		}
		emit(Line{Action: "dispatch", ID: id})
		if _, err := c.Append(ctx, []byte("dispatched "+id+"\n")); err != nil {
			return err
		}
	}

	tick := time.NewTicker(time.Duration(poll) * time.Millisecond)
	defer tick.Stop()
	for polls := 1; ; polls++ {
		r, ok, err := c.Result(ctx, id)
		if err != nil {
			return err
		}
		if ok {
			var p bytes.Buffer
			if err := json.Compact(&p, r.Payload); err != nil {
				return fmt.Errorf("result %s: %w", id, err)
			}
			size, err := c.Append(ctx, []byte("result "+p.String()+"\n"))
			if err != nil {
				return err
			}
			emit(Line{Action: "result", ID: id, Polls: polls, Size: size, Payload: p.Bytes()})
			return nil
		}
		<-tick.C
	}
}

func env(name, def string) string {
	if s := os.Getenv(name); s != "" {
		return s
	}
	return def
}

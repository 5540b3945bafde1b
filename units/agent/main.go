// Command agent is a demo transcript-mode unit: an agent that works
// through STEPS steps (default 3), each ending in an outward call it
// awaits, and that keeps all its state in its transcript, so the daemon can
// park it on every await and start it again, in a fresh sandbox, when the
// result arrives.
//
// Step i appends "step i: thinking", does WORK_ITERS rounds of SHA-256
// (default 200000) as its thinking, dispatches call "call-i" of kind KIND
// (default "build"), appends "step i: dispatched call-i" and awaits
// call-i, which parks the run. Started again with the result delivered, it
// appends "step i: result PAYLOAD" (the payload as compact JSON) and goes
// on. After the last step it appends "done" and exits 0.
//
// On start it says hello, then reads the transcript to find where it is
// and continues from there: it never appends a line twice and never
// dispatches a call the transcript records. If it was stopped between a
// dispatch and the line recording it, the daemon refuses the second
// dispatch as duplicate_call and the agent records the call as dispatched.
//
// RUNRECORDD_DIR names the protocol directory (default /run/runrecordd).
// Every action is one JSON line on stdout. A transcript it cannot read
// prints a line with "error" and exits 3; a protocol failure exits 1.
// Parked, it waits for the daemon to destroy the sandbox, and exits 0 on
// SIGTERM or SIGINT.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/runrecordd/runrecordd/pkg/protocol"
)

// errTranscript is a transcript this agent did not write.
var errTranscript = errors.New("transcript not understood")

// Line is one report on stdout.
type Line struct {
	Action   string          `json:"action"`
	Run      string          `json:"run,omitempty"`
	Interval int64           `json:"interval,omitempty"`
	Step     int             `json:"step,omitempty"`
	ID       string          `json:"id,omitempty"`
	Text     string          `json:"text,omitempty"`
	Size     int64           `json:"size,omitempty"`
	Digest   string          `json:"digest,omitempty"`
	Parking  *bool           `json:"parking,omitempty"`
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

// Stages of a step, as far as the transcript records it.
const (
	stageNone       = iota // nothing of this step yet
	stageThinking          // "step i: thinking"
	stageDispatched        // "step i: dispatched call-i"
)

// position is where the transcript says the agent is.
type position struct {
	step  int // the step in progress, from 1
	stage int
	done  bool
	size  int64 // the transcript's bytes
}

type config struct {
	steps int
	iters int
	kind  string
	dir   string
}

func main() {
	cfg, err := configure()
	if err != nil {
		emit(Line{Action: "error", Error: err.Error()})
		os.Exit(2)
	}
	if err := run(context.Background(), cfg); err != nil {
		emit(Line{Action: "error", Error: err.Error()})
		if errors.Is(err, errTranscript) {
			os.Exit(3)
		}
		os.Exit(1)
	}
}

func configure() (config, error) {
	cfg := config{steps: 3, iters: 200000, kind: "build", dir: protocol.Dir}
	for _, v := range []struct {
		name string
		to   *int
	}{{"STEPS", &cfg.steps}, {"WORK_ITERS", &cfg.iters}} {
		if s := os.Getenv(v.name); s != "" {
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				return cfg, fmt.Errorf("%s=%q: want a count", v.name, s)
			}
			*v.to = n
		}
	}
	if s := os.Getenv("KIND"); s != "" {
		cfg.kind = s
	}
	if s := os.Getenv("RUNRECORDD_DIR"); s != "" {
		cfg.dir = s
	}
	return cfg, nil
}

// agent is the agent connected to its interval, at the position its
// transcript records.
type agent struct {
	c   *protocol.Client
	cfg config
	pos position
}

func run(ctx context.Context, cfg config) error {
	c, err := protocol.Dial(filepath.Join(cfg.dir, protocol.SocketFile))
	if err != nil {
		return err
	}
	defer c.Close()
	hello, err := c.Hello(ctx)
	if err != nil {
		return err
	}
	emit(Line{Action: "hello", Run: hello.Run, Interval: hello.Interval})

	pos, err := readTranscript(filepath.Join(cfg.dir, protocol.TranscriptFile))
	if err != nil {
		return err
	}
	emit(Line{Action: "position", Step: pos.step, Size: pos.size, Note: stageName(pos)})
	if pos.done {
		return nil
	}
	a := &agent{c: c, cfg: cfg, pos: pos}
	for a.pos.step <= cfg.steps {
		parked, err := a.advance(ctx)
		if err != nil {
			return err
		}
		if parked {
			waitForEnd()
			return nil
		}
	}
	if err := a.appendLine(ctx, 0, "done"); err != nil {
		return err
	}
	emit(Line{Action: "done"})
	return nil
}

// advance takes the step in progress one stage further: from nothing to
// thinking, from thinking to a dispatched call, from a dispatched call to
// its result and the next step. parked is true when the await parked the
// run.
func (a *agent) advance(ctx context.Context) (parked bool, err error) {
	i := a.pos.step
	id := fmt.Sprintf("call-%d", i)
	switch a.pos.stage {
	case stageNone:
		if err := a.appendLine(ctx, i, fmt.Sprintf("step %d: thinking", i)); err != nil {
			return false, err
		}
		a.pos.stage = stageThinking
	case stageThinking:
		if err := a.dispatch(ctx, i, id); err != nil {
			return false, err
		}
		a.pos.stage = stageDispatched
	case stageDispatched:
		r, parked, err := a.await(ctx, i, id)
		if err != nil || parked {
			return parked, err
		}
		emit(Line{Action: "result", Step: i, ID: id, Payload: r.Payload})
		if err := a.appendLine(ctx, i, fmt.Sprintf("step %d: result %s", i, r.Payload)); err != nil {
			return false, err
		}
		a.pos.step, a.pos.stage = i+1, stageNone
	}
	return false, nil
}

// dispatch thinks, dispatches step i's call id and records it. A call the
// daemon already holds (the agent stopped before recording it) counts as
// dispatched.
func (a *agent) dispatch(ctx context.Context, i int, id string) error {
	digest := think(i, a.cfg.iters)
	emit(Line{Action: "think", Step: i, Digest: digest})
	payload, _ := json.Marshal(map[string]any{"step": i, "digest": digest})
	err := a.c.Dispatch(ctx, protocol.Call{ID: id, Kind: a.cfg.kind, Payload: payload})
	switch {
	case errors.Is(err, protocol.ErrDuplicateCall):
		emit(Line{Action: "dispatch", Step: i, ID: id, Note: "already dispatched before a restart"})
	case err != nil:
		return err
	default:
		emit(Line{Action: "dispatch", Step: i, ID: id, Payload: payload})
	}
	return a.appendLine(ctx, i, fmt.Sprintf("step %d: dispatched %s", i, id))
}

// await returns call id's result if it is delivered, and otherwise awaits
// it: parked is true when the await parks the run.
func (a *agent) await(ctx context.Context, i int, id string) (r protocol.Result, parked bool, err error) {
	r, ok, err := delivered(ctx, a.c, id)
	if err != nil || ok {
		return r, false, err
	}
	parking, err := a.c.Await(ctx, id)
	if err != nil {
		return r, false, err
	}
	emit(Line{Action: "await", Step: i, ID: id, Parking: &parking})
	if parking {
		return r, true, nil
	}
	if r, ok, err = delivered(ctx, a.c, id); err != nil {
		return r, false, err
	}
	if !ok {
		return r, false, fmt.Errorf("await %s: daemon says delivered, results lack it", id)
	}
	return r, false, nil
}

// appendLine appends one line and checks the transcript grew from exactly
// the bytes this agent read: the file it read is the file the daemon
// writes.
func (a *agent) appendLine(ctx context.Context, step int, text string) error {
	size, err := a.c.Append(ctx, []byte(text+"\n"))
	if err != nil {
		return err
	}
	if want := a.pos.size + int64(len(text)) + 1; size != want {
		return fmt.Errorf("%w: transcript is %d bytes after append, want %d", errTranscript, size, want)
	}
	a.pos.size = size
	emit(Line{Action: "append", Step: step, Text: text, Size: size})
	return nil
}

// delivered looks for id among the results delivered to this interval.
// The payload comes back compact, so it fits on one transcript line.
func delivered(ctx context.Context, c *protocol.Client, id string) (protocol.Result, bool, error) {
	rs, err := c.Results(ctx)
	if err != nil {
		return protocol.Result{}, false, err
	}
	for _, r := range rs {
		if r.ID == id {
			var b bytes.Buffer
			if err := json.Compact(&b, r.Payload); err != nil {
				return r, false, fmt.Errorf("result %s: %w", id, err)
			}
			r.Payload = b.Bytes()
			return r, true, nil
		}
	}
	return protocol.Result{}, false, nil
}

// think is the step's computation: iters rounds of SHA-256 over the step
// number.
func think(step, iters int) string {
	sum := sha256.Sum256([]byte(strconv.Itoa(step)))
	for range iters {
		sum = sha256.Sum256(sum[:])
	}
	return hex.EncodeToString(sum[:8])
}

// waitForEnd blocks until the daemon stops the parked sandbox.
func waitForEnd() {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	emit(Line{Action: "stopped", Note: "parked"})
}

// readTranscript finds the agent's position from its transcript, which
// must be lines this agent writes, in the order it writes them.
func readTranscript(path string) (position, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return position{}, err
	}
	pos := position{step: 1, size: int64(len(b))}
	if len(b) == 0 {
		return pos, nil
	}
	if b[len(b)-1] != '\n' {
		return pos, fmt.Errorf("%w: last line has no newline", errTranscript)
	}
	for n, line := range strings.Split(string(b[:len(b)-1]), "\n") {
		if err := pos.advance(line); err != nil {
			return pos, fmt.Errorf("%w: line %d %q: %v", errTranscript, n+1, line, err)
		}
	}
	return pos, nil
}

// advance moves pos past one transcript line.
func (p *position) advance(line string) error {
	if p.done {
		return errors.New("after done")
	}
	if line == "done" {
		if p.stage != stageNone {
			return errors.New("done in the middle of a step")
		}
		p.done = true
		return nil
	}
	prefix := fmt.Sprintf("step %d: ", p.step)
	rest, ok := strings.CutPrefix(line, prefix)
	if !ok {
		return fmt.Errorf("want a line of step %d", p.step)
	}
	switch {
	case rest == "thinking" && p.stage == stageNone:
		p.stage = stageThinking
	case rest == fmt.Sprintf("dispatched call-%d", p.step) && p.stage == stageThinking:
		p.stage = stageDispatched
	case strings.HasPrefix(rest, "result ") && p.stage == stageDispatched:
		if !json.Valid([]byte(rest[len("result "):])) {
			return errors.New("result is not JSON")
		}
		p.step, p.stage = p.step+1, stageNone
	default:
		return fmt.Errorf("out of order at stage %d", p.stage)
	}
	return nil
}

func stageName(p position) string {
	switch {
	case p.done:
		return "done"
	case p.stage == stageThinking:
		return "thinking"
	case p.stage == stageDispatched:
		return "dispatched"
	}
	return "start"
}

// Package conformance reads and runs the conformance pack in
// testdata/conformance: JSON vectors for classes C6, C14 and C15, generated
// by ./gen and replayed here against pkg/record.
//
// A vector file holds one class. Each case replays its steps on a fresh
// record and checks what the case states: the outcome of every append, the
// final head, the idle total, the wait-proof verdict, the head of the same
// trace with its call accounts dropped, the verdict of decoding a wire form,
// and canonical bytes against hex written out by hand.
package conformance

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Class is one vector file.
type Class struct {
	Class       string `json:"class"`
	Description string `json:"description"`
	Cases       []Case `json:"cases"`
}

// Case is one scenario on a fresh record.
type Case struct {
	Name   string         `json:"name"`
	Unit   record.Address `json:"unit_id"`
	Grants record.Address `json:"grants_id"`
	Steps  []Step         `json:"steps,omitempty"`

	Head         *record.Address `json:"expect_head,omitempty"`
	IdleUJ       *uint64         `json:"expect_idle_uj,omitempty"`
	WaitProof    *Verdict        `json:"expect_wait_proof,omitempty"`
	StrippedHead *record.Address `json:"expect_head_without_accounts,omitempty"`
	Differs      *record.Address `json:"expect_head_differs_from,omitempty"`

	Wire        string `json:"wire,omitempty"`
	WireExpect  string `json:"expect_wire,omitempty"`
	WireSegment *int   `json:"expect_wire_segment,omitempty"`

	Pins []Pin `json:"canonical,omitempty"`
}

// Step appends one segment and states the outcome: "ok" with the head, or
// the name of the refusal.
type Step struct {
	Segment record.Segment  `json:"segment"`
	Expect  string          `json:"expect"`
	Head    *record.Address `json:"head,omitempty"`
}

// Verdict is a wait-proof verdict; Segment is -1 when it names none.
type Verdict struct {
	Kind    string `json:"kind"`
	Segment int    `json:"segment"`
}

// Pin states a segment's canonical bytes in hex written by hand.
type Pin struct {
	Name    string         `json:"name"`
	Segment record.Segment `json:"segment"`
	Hex     string         `json:"hex"`
}

// Errors by their vector names.
var errNames = []struct {
	name string
	err  error
}{
	{"SnapshotMismatch", record.ErrSnapshotMismatch},
	{"MalformedSnapshot", record.ErrMalformedSnapshot},
	{"MalformedSegment", record.ErrMalformedSegment},
	{"Parked", record.ErrParked},
	{"NotParked", record.ErrNotParked},
	{"Closed", record.ErrClosed},
	{"Alternation", record.ErrAlternation},
	{"Overflow", record.ErrOverflow},
	{"HeadMismatch", record.ErrHeadMismatch},
	{"Canonical", record.ErrCanonical},
	{"Address", record.ErrAddress},
}

// ErrorName returns the vector name of err: "ok" for nil.
func ErrorName(err error) string {
	if err == nil {
		return "ok"
	}
	for _, e := range errNames {
		if errors.Is(err, e.err) {
			return e.name
		}
	}
	return "error(" + err.Error() + ")"
}

// Result is one class's outcome.
type Result struct {
	Class  string
	Cases  int
	Failed []string // one line per failed case; empty when the class passed
}

// Passed reports whether every case of the class passed.
func (r Result) Passed() bool { return len(r.Failed) == 0 }

// Load reads every *.json vector file in dir, sorted by class.
func Load(dir string) ([]Class, error) { return LoadFS(os.DirFS(dir), ".") }

// LoadFS reads every *.json vector file in dir of fsys, sorted by class.
func LoadFS(fsys fs.FS, dir string) ([]Class, error) {
	files, err := fs.Glob(fsys, path.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("conformance: no vector files in %s", dir)
	}
	var out []Class
	for _, f := range files {
		b, err := fs.ReadFile(fsys, f)
		if err != nil {
			return nil, err
		}
		if err := keysOnce(b); err != nil {
			return nil, fmt.Errorf("conformance: %s: %w", f, err)
		}
		var c Class
		d := json.NewDecoder(bytes.NewReader(b))
		d.DisallowUnknownFields()
		if err := d.Decode(&c); err != nil {
			return nil, fmt.Errorf("conformance: %s: %w", f, err)
		}
		if d.More() {
			return nil, fmt.Errorf("conformance: %s: trailing data after the class", f)
		}
		if err := c.check(); err != nil {
			return nil, fmt.Errorf("conformance: %s: %w", f, err)
		}
		out = append(out, c)
	}
	sort.Slice(out, func(i, j int) bool { return classOrder(out[i].Class) < classOrder(out[j].Class) })
	return out, nil
}

// keysOnce refuses a vector file with a key twice in one object, or a key
// with an upper-case letter: encoding/json would keep the last of two and
// fold "Name" to "name", and every key of the format is lower case.
func keysOnce(b []byte) error {
	d := json.NewDecoder(bytes.NewReader(b))
	type frame struct {
		keys  map[string]bool
		isKey bool // the next token in this object is a key
	}
	var stack []*frame
	for {
		t, err := d.Token()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if k, ok := t.(string); ok && top != nil && top.isKey {
			if top.keys[k] || strings.ToLower(k) != k {
				return fmt.Errorf("the key %q twice in one object, or not in lower case", k)
			}
			top.keys[k] = true
			top.isKey = false
			continue
		}
		switch t {
		case json.Delim('{'):
			stack = append(stack, &frame{keys: map[string]bool{}, isKey: true})
			continue
		case json.Delim('['):
			stack = append(stack, &frame{})
			continue
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		// A value ended: the object around it expects a key next.
		if len(stack) > 0 && stack[len(stack)-1].keys != nil {
			stack[len(stack)-1].isKey = true
		}
	}
}

func classOrder(c string) int {
	var n int
	fmt.Sscanf(strings.TrimPrefix(c, "C"), "%d", &n)
	return n
}

// check refuses a vector file a reader could take two ways: a class not
// named C<n>, a case without a name or ids, a step whose outcome is not a
// known name, a wire expectation without a wire form (or the reverse), a
// segment index without a wire form, and a case that checks nothing.
func (c Class) check() error {
	var n int
	if _, err := fmt.Sscanf(c.Class, "C%d", &n); err != nil || fmt.Sprintf("C%d", n) != c.Class {
		return fmt.Errorf("class %q is not C<n>", c.Class)
	}
	names := map[string]bool{"ok": true}
	for _, e := range errNames {
		names[e.name] = true
	}
	seen := map[string]bool{}
	for _, cs := range c.Cases {
		switch {
		case cs.Name == "" || seen[cs.Name]:
			return fmt.Errorf("case %q: empty or repeated name", cs.Name)
		case cs.Unit.IsZero() || cs.Grants.IsZero():
			return fmt.Errorf("case %s: unit_id and grants_id are required", cs.Name)
		case (cs.Wire == "") != (cs.WireExpect == ""):
			return fmt.Errorf("case %s: wire and expect_wire go together", cs.Name)
		case cs.WireSegment != nil && cs.Wire == "":
			return fmt.Errorf("case %s: expect_wire_segment without a wire form", cs.Name)
		case cs.WireExpect != "" && !names[cs.WireExpect]:
			return fmt.Errorf("case %s: expect_wire %q is not an outcome name", cs.Name, cs.WireExpect)
		case len(cs.Steps) == 0 && cs.Head == nil && cs.Wire == "" && len(cs.Pins) == 0:
			return fmt.Errorf("case %s: checks nothing (no steps, expect_head, wire or canonical)", cs.Name)
		}
		seen[cs.Name] = true
		for i, st := range cs.Steps {
			if !names[st.Expect] {
				return fmt.Errorf("case %s: step %d: expect %q is not an outcome name", cs.Name, i, st.Expect)
			}
			if st.Head != nil && st.Expect != "ok" {
				return fmt.Errorf("case %s: step %d: a refused step states no head", cs.Name, i)
			}
		}
	}
	return nil
}

// Run replays every case of c.
func Run(c Class) Result {
	res := Result{Class: c.Class, Cases: len(c.Cases)}
	for _, cs := range c.Cases {
		if err := runCase(cs); err != nil {
			res.Failed = append(res.Failed, fmt.Sprintf("%s: %v", cs.Name, err))
		}
	}
	if len(c.Cases) == 0 {
		res.Failed = append(res.Failed, "class has no cases")
	}
	return res
}

// runCase replays c's steps into a fresh record, then checks every
// outcome c states; the first that fails is the case's error.
func runCase(c Case) error {
	r, err := replaySteps(c)
	if err != nil {
		return err
	}
	if err := checkRecord(c, r); err != nil {
		return err
	}
	if err := checkStripped(c, r); err != nil {
		return err
	}
	if err := checkWire(c); err != nil {
		return err
	}
	return checkPins(c)
}

// replaySteps appends c's steps to a fresh record, checking each outcome:
// an accepted step's head, and that a refused one names its segment and
// leaves the record as it was.
func replaySteps(c Case) (*record.Record, error) {
	r := record.New(c.Unit, c.Grants)
	for i, st := range c.Steps {
		before := r.State()
		h, err := r.Append(st.Segment)
		if got := ErrorName(err); got != st.Expect {
			return nil, fmt.Errorf("step %d: got %s, want %s", i, got, st.Expect)
		}
		if err != nil {
			if r.State() != before {
				return nil, fmt.Errorf("step %d: refused append changed the record", i)
			}
			var se *record.SegmentError
			if !errors.As(err, &se) || se.Index != r.Len() {
				return nil, fmt.Errorf("step %d: refusal does not name segment %d: %v", i, r.Len(), err)
			}
			continue
		}
		if st.Head != nil && h != *st.Head {
			return nil, fmt.Errorf("step %d: head %s, want %s", i, h, *st.Head)
		}
	}
	return r, nil
}

// checkRecord checks the replayed record: it verifies, and its head, idle
// total and wait proof are those c states.
func checkRecord(c Case, r *record.Record) error {
	if err := r.Verify(); err != nil {
		return fmt.Errorf("record does not verify: %w", err)
	}
	if c.Head != nil && r.Head() != *c.Head {
		return fmt.Errorf("head %s, want %s", r.Head(), *c.Head)
	}
	if c.Differs != nil && r.Head() == *c.Differs {
		return fmt.Errorf("head %s equals the head it must differ from", r.Head())
	}
	if c.IdleUJ != nil {
		t, err := r.Totals(func(record.Address) (uint64, bool) { return 0, true })
		if err != nil {
			return err
		}
		if t.IdleUJ != *c.IdleUJ {
			return fmt.Errorf("idle %d uJ, want %d", t.IdleUJ, *c.IdleUJ)
		}
	}
	if c.WaitProof != nil {
		v := r.WaitProof()
		if v.Kind.String() != c.WaitProof.Kind || v.Segment != c.WaitProof.Segment {
			return fmt.Errorf("wait proof %s at %d, want %s at %d", v.Kind, v.Segment, c.WaitProof.Kind, c.WaitProof.Segment)
		}
	}
	return nil
}

// checkStripped replays r's segments without their call accounts, when c
// states the head that must give.
func checkStripped(c Case, r *record.Record) error {
	if c.StrippedHead == nil {
		return nil
	}
	s := record.New(c.Unit, c.Grants)
	for i := range r.Len() {
		seg := r.Segment(i)
		seg.Calls = nil
		if _, err := s.Append(seg); err != nil {
			return fmt.Errorf("replay without accounts: %w", err)
		}
	}
	if s.Head() != *c.StrippedHead {
		return fmt.Errorf("head without accounts %s, want %s", s.Head(), *c.StrippedHead)
	}
	return nil
}

// checkWire decodes c's wire form, when it has one, and checks the
// outcome and the segment a refusal names.
func checkWire(c Case) error {
	if c.WireExpect == "" {
		return nil
	}
	_, err := record.DecodeWire([]byte(c.Wire))
	if got := ErrorName(err); got != c.WireExpect {
		return fmt.Errorf("wire form: got %s (%v), want %s", got, err, c.WireExpect)
	}
	if c.WireSegment != nil {
		var se *record.SegmentError
		if !errors.As(err, &se) || se.Index != *c.WireSegment {
			return fmt.Errorf("wire form: error %v does not name segment %d", err, *c.WireSegment)
		}
	}
	return nil
}

// checkPins compares each pinned segment's canonical bytes with the hex
// written by hand.
func checkPins(c Case) error {
	for _, p := range c.Pins {
		want, err := hex.DecodeString(strings.ReplaceAll(p.Hex, " ", ""))
		if err != nil {
			return fmt.Errorf("pin %s: %w", p.Name, err)
		}
		got, err := p.Segment.Canonical()
		if err != nil {
			return fmt.Errorf("pin %s: %w", p.Name, err)
		}
		if !bytes.Equal(got, want) {
			return fmt.Errorf("pin %s: bytes %x, want %x", p.Name, got, want)
		}
	}
	return nil
}

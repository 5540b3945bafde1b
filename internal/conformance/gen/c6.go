package main

import (
	"encoding/json"
	"log"
	"math"
	"strings"

	"github.com/runrecordd/runrecordd/internal/conformance"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// c6 is class C6: the chain across execute → suspend → resume → execute,
// and every append the record refuses. Its cases are built in the steps
// below, in the order the vector file lists them.
func c6() conformance.Class {
	c := conformance.Class{Class: "C6", Description: "chain advance and verification across execute → suspend → resume → execute; forked snapshots refused; execution while parked refused; idle energy accumulates; a modified recorded snapshot fails verification through the wire form; appends after close refused"}
	for _, step := range []func() []conformance.Case{
		c6Lifecycle, c6ParkedRefusals, c6TamperedWire, c6SequenceRefusals,
		c6ValueRefusals, c6StrayKeys, c6EditedWire, c6EmptyRecord,
	} {
		c.Cases = append(c.Cases, step()...)
	}
	return c
}

// c6Lifecycle: two parks and three intervals, whose idle energy adds up.
func c6Lifecycle() []conformance.Case {
	life := newCase("c6-lifecycle").
		ok(exec(1)).
		ok(record.Suspension(image("a"), addr("manifest:a"))).
		ok(record.Resumption(image("a"), 1_500_000, record.Estimated)).
		ok(exec(2)).
		ok(record.Suspension(image("b"), addr("manifest:a"))).
		ok(record.Resumption(image("b"), 2_500_000, record.Measured)).
		ok(exec(3))
	lc := life.done()
	lc.IdleUJ = u64(4_000_000)
	return []conformance.Case{lc}
}

// c6ParkedRefusals: a resume must offer the snapshot the park recorded,
// and nothing but a resume may follow a park.
func c6ParkedRefusals() []conformance.Case {
	var cases []conformance.Case
	fork := image("a")
	fork.Memory = ptr(addr("memory:a-forked"))
	cases = append(cases, newCase("c6-forked-snapshot").
		ok(exec(1)).
		ok(record.Suspension(image("a"), addr("manifest:a"))).
		refuse(record.Resumption(fork, 1, record.Estimated), "SnapshotMismatch").
		refuse(record.Resumption(record.ImageSnapshot(addr("root:a"), nil), 1, record.Estimated), "SnapshotMismatch").
		ok(record.Resumption(image("a"), 1, record.Estimated)).
		done())

	cases = append(cases, newCase("c6-execution-while-parked").
		ok(exec(1)).
		ok(record.Suspension(image("a"), addr("manifest:a"))).
		refuse(exec(2), "Parked").
		refuse(record.Suspension(image("a"), addr("manifest:a")), "Parked").
		ok(record.Resumption(image("a"), 1, record.Estimated)).
		refuse(record.Resumption(image("a"), 1, record.Estimated), "NotParked").
		ok(exec(2)).
		done())
	return cases
}

// c6TamperedWire: a recorded snapshot changed in the wire form fails
// verification at its segment; the untouched wire form verifies.
func c6TamperedWire() []conformance.Case {
	var cases []conformance.Case
	tamper := newCase("c6-tampered-wire-snapshot").
		ok(exec(1)).
		ok(record.Suspension(image("a"), addr("manifest:a"))).
		ok(record.Resumption(image("a"), 10, record.Estimated))
	tc := tamper.done()
	wire := string(tamper.r.EncodeWire())
	tc.Wire = strings.Replace(wire, addr("memory:a").String(), addr("memory:evil").String(), 1)
	tc.WireExpect, tc.WireSegment = "HeadMismatch", intp(1)
	cases = append(cases, tc)

	both := tamper.done()
	both.Name = "c6-tampered-wire-both-snapshots"
	both.Wire = strings.ReplaceAll(wire, addr("memory:a").String(), addr("memory:evil").String())
	both.WireExpect, both.WireSegment = "HeadMismatch", intp(1)
	cases = append(cases, both)

	intact := tamper.done()
	intact.Name = "c6-intact-wire"
	intact.Wire, intact.WireExpect = wire, "ok"
	cases = append(cases, intact)
	return cases
}

// c6SequenceRefusals: appends after a close, a zero idle figure, a close
// while parked, and the strict alternation of intervals and parks.
func c6SequenceRefusals() []conformance.Case {
	var cases []conformance.Case
	cases = append(cases, newCase("c6-append-after-close").
		ok(exec(1)).
		ok(record.Closure("finished")).
		refuse(exec(2), "Closed").
		refuse(record.Suspension(image("a"), addr("manifest:a")), "Closed").
		refuse(record.Closure("again"), "Closed").
		done())

	// The spec: a host MUST NOT record a transcript park's idle_uj as
	// zero; runrecordd holds image parks to the same rule (a park always
	// retains something).
	cases = append(cases, newCase("c6-zero-idle").
		ok(exec(1)).
		ok(record.Suspension(record.TranscriptSnapshot(addr("transcript:a")), addr("manifest:t"))).
		refuse(record.Resumption(record.TranscriptSnapshot(addr("transcript:a")), 0, record.Estimated), "MalformedSegment").
		refuse(record.Resumption(record.TranscriptSnapshot(addr("transcript:a")), 0, record.Measured), "MalformedSegment").
		ok(record.Resumption(record.TranscriptSnapshot(addr("transcript:a")), 1, record.Estimated)).
		ok(exec(2)).
		ok(record.Suspension(image("a"), addr("manifest:a"))).
		refuse(record.Resumption(image("a"), 0, record.Estimated), "MalformedSegment").
		ok(record.Resumption(image("a"), 1, record.Measured)).
		done())

	cases = append(cases, newCase("c6-close-while-parked").
		ok(exec(1)).
		ok(record.Suspension(image("a"), addr("manifest:a"))).
		ok(record.Closure("abandoned while parked")).
		refuse(record.Resumption(image("a"), 1, record.Estimated), "Closed").
		done())

	// Strict alternation: a park ends an executed interval, so a
	// Suspended segment follows an Executed one — never genesis, a
	// Resumed or another Suspended. Intervals may follow one another.
	cases = append(cases, newCase("c6-alternation").
		refuse(record.Suspension(image("a"), addr("manifest:a")), "Alternation").
		ok(exec(1)).
		ok(exec(2)).
		ok(record.Suspension(image("a"), addr("manifest:a"))).
		ok(record.Resumption(image("a"), 1, record.Estimated)).
		refuse(record.Suspension(image("b"), addr("manifest:a")), "Alternation").
		ok(exec(3)).
		ok(record.Suspension(image("b"), addr("manifest:a"))).
		done())
	return cases
}

// c6ValueRefusals: an idle total past 2⁶⁴−1 and the zero address.
func c6ValueRefusals() []conformance.Case {
	var cases []conformance.Case
	// The idle total is a uint64 of µJ: a Resumed segment that would take
	// it past 2⁶⁴−1 is refused; exactly 2⁶⁴−1 is a record.
	over := newCase("c6-idle-overflow").
		ok(exec(1)).
		ok(record.Suspension(transcript("o1"), addr("manifest:t"))).
		ok(record.Resumption(transcript("o1"), math.MaxUint64-10, record.Measured)).
		ok(exec(2)).
		ok(record.Suspension(transcript("o2"), addr("manifest:t"))).
		refuse(record.Resumption(transcript("o2"), 11, record.Measured), "Overflow").
		ok(record.Resumption(transcript("o2"), 10, record.Measured))
	oc := over.done()
	oc.IdleUJ = u64(math.MaxUint64)
	cases = append(cases, oc)

	// The zero address names no object: refused wherever a segment
	// states an address.
	var zero record.Address
	cases = append(cases, newCase("c6-zero-addresses").
		refuse(record.Execution(zero, nil), "MalformedSegment").
		ok(exec(1)).
		refuse(record.Suspension(image("a"), zero), "MalformedSegment").
		refuse(record.Suspension(record.ImageSnapshot(zero, nil), addr("manifest:a")), "MalformedSnapshot").
		refuse(record.Suspension(record.ImageSnapshot(addr("root:a"), &zero), addr("manifest:a")), "MalformedSnapshot").
		refuse(record.Suspension(record.TranscriptSnapshot(zero), addr("manifest:a")), "MalformedSnapshot").
		ok(record.Suspension(image("a"), addr("manifest:a"))).
		done())
	return cases
}

// c6StrayKeys: a key of another kind is a stray field whatever its
// value, a zero one included.
func c6StrayKeys() []conformance.Case {
	var zero record.Address
	att := `"attestation":"` + addr("attestation:s").String() + `"`
	return []conformance.Case{newCase("c6-stray-keys").
		ok(exec(1)).
		refuse(wireSegment(`{"kind":"executed",`+att+`,"snapshot":{}}`), "MalformedSegment").
		refuse(wireSegment(`{"kind":"executed",`+att+`,"reason":""}`), "MalformedSegment").
		refuse(wireSegment(`{"kind":"executed",`+att+`,"idle_uj":0}`), "MalformedSegment").
		refuse(wireSegment(`{"kind":"suspended","snapshot":{"transcript":"`+addr("transcript:s").String()+`"},"manifest":"`+addr("manifest:s").String()+`","reason":""}`), "MalformedSegment").
		refuse(wireSegment(`{"kind":"closed","attestation":"`+zero.String()+`","reason":""}`), "MalformedSegment").
		refuse(wireSegment(`{"kind":"closed","manifest":"`+zero.String()+`","reason":""}`), "MalformedSegment").
		ok(record.Closure("")).
		done()}
}

// wireSegment reads a segment written by hand in the wire form: a segment
// the record's constructors cannot make, such as one with a stray key.
func wireSegment(js string) record.Segment {
	var s record.Segment
	if err := json.Unmarshal([]byte(js), &s); err != nil {
		log.Fatalf("%s: %v", js, err)
	}
	return s
}

// c6EditedWire: wire forms edited so they no longer decode.
func c6EditedWire() []conformance.Case {
	var cases []conformance.Case
	var zero record.Address
	// Wire forms edited so they no longer decode, each named by segment.
	ed := newCase("c6-edited-wire").
		ok(record.Execution(addr("attestation:1"), &record.CallAccount{Dispatched: []string{"build-1"}})).
		ok(record.Suspension(image("e"), addr("manifest:e"))).
		ok(record.Resumption(image("e"), 7, record.Estimated))
	edWire := string(ed.r.EncodeWire())
	edCase := ed.done()
	for _, e := range []struct {
		name, old, new, want string
		seg                  int
	}{
		{"unknown-key", `{"kind":"resumed",`, `{"kind":"resumed","note":"x",`, "Canonical", 2},
		{"float-idle", `"idle_uj":7,`, `"idle_uj":7.0,`, "Canonical", 2},
		{"malformed-address", `"manifest":"b3:`, `"manifest":"b3:!`, "Canonical", 1},
		{"missing-list", `,"resolved":[]`, ``, "Canonical", 0},
		{"zero-root", `"root":"` + addr("root:e").String(), `"root":"` + zero.String(), "MalformedSnapshot", 1},
		{"stray-empty-reason", `"provenance":"estimated"`, `"provenance":"estimated","reason":""`, "MalformedSegment", 2},
		{"stray-zero-idle", `"resolved":[]}`, `"resolved":[]},"idle_uj":0`, "MalformedSegment", 0},
		{"stray-zero-attestation", `"kind":"suspended",`, `"kind":"suspended","attestation":"` + zero.String() + `",`, "MalformedSegment", 1},
		{"duplicate-key", `"idle_uj":7,`, `"idle_uj":7,"idle_uj":7,`, "Canonical", 2},
		{"duplicate-nested-key", `"snapshot":{"root":"`, `"snapshot":{"root":"` + addr("root:x").String() + `","root":"`, "Canonical", 1},
		{"key-case", `{"kind":"resumed",`, `{"Kind":"resumed",`, "Canonical", 2},
		{"null-value", `"kind":"suspended",`, `"kind":"suspended","reason":null,`, "Canonical", 1},
	} {
		if !strings.Contains(edWire, e.old) {
			log.Fatalf("c6-edited-wire-%s: %q not in the wire form", e.name, e.old)
		}
		w := edCase
		w.Name = "c6-edited-wire-" + e.name
		w.Wire, w.WireExpect, w.WireSegment = strings.Replace(edWire, e.old, e.new, 1), e.want, intp(e.seg)
		cases = append(cases, w)
	}
	zeroUnit := edCase
	zeroUnit.Name = "c6-edited-wire-zero-unit"
	zeroUnit.Wire, zeroUnit.WireExpect = strings.Replace(edWire, `"unit_id":"`+edCase.Unit.String(), `"unit_id":"`+zero.String(), 1), "Address"
	cases = append(cases, zeroUnit)
	badUnit := edCase
	badUnit.Name = "c6-edited-wire-malformed-unit-id"
	badUnit.Wire, badUnit.WireExpect = strings.Replace(edWire, `"unit_id":"b3:`, `"unit_id":"b3:!`, 1), "Canonical"
	cases = append(cases, badUnit)
	return cases
}

// c6EmptyRecord: the empty record, whose head is its genesis and whose
// wire form has no segment.
func c6EmptyRecord() []conformance.Case {
	empty := newCase("c6-empty-record")
	ec := empty.done()
	ec.Wire, ec.WireExpect = string(empty.r.EncodeWire()), "ok"
	return []conformance.Case{ec}
}

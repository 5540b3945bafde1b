package main

import (
	"bytes"
	"strings"

	"github.com/runrecordd/runrecordd/internal/conformance"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// c14 is class C14: the two forms a park may retain, transcript and image,
// and the image form's bytes pinned by hand.
func c14() conformance.Class {
	c := conformance.Class{Class: "C14", Description: "the two forms a park may retain: a transcript park chains, verifies and accumulates idle energy; neither/both/transcript-beside-memory-image refused with MalformedSnapshot leaving no segment; image and transcript over one inner address are different parks; the image form's bytes pinned against a hand-written layout"}

	tp := newCase("c14-transcript-park").
		ok(record.Execution(addr("attestation:1"), &record.CallAccount{})).
		ok(record.Suspension(transcript("t1"), addr("manifest:t"))).
		ok(record.Resumption(transcript("t1"), 120, record.Estimated)).
		ok(record.Execution(addr("attestation:2"), &record.CallAccount{})).
		ok(record.Suspension(transcript("t2"), addr("manifest:t"))).
		ok(record.Resumption(transcript("t2"), 80, record.Estimated))
	tc := tp.done()
	tc.IdleUJ = u64(200)
	tc.Wire, tc.WireExpect = string(tp.r.EncodeWire()), "ok"
	c.Cases = append(c.Cases, tc)

	inner := addr("inner")
	neither := record.Snapshot{}
	both := record.Snapshot{Root: ptr(inner), Transcript: ptr(inner)}
	beside := record.Snapshot{Memory: ptr(addr("memory:x")), Transcript: ptr(inner)}
	c.Cases = append(c.Cases, newCase("c14-malformed-references").
		ok(exec(1)).
		refuse(record.Suspension(neither, addr("manifest:x")), "MalformedSnapshot").
		refuse(record.Suspension(both, addr("manifest:x")), "MalformedSnapshot").
		refuse(record.Suspension(beside, addr("manifest:x")), "MalformedSnapshot").
		ok(record.Suspension(record.TranscriptSnapshot(inner), addr("manifest:x"))).
		refuse(record.Resumption(beside, 1, record.Estimated), "MalformedSnapshot").
		refuse(record.Resumption(neither, 1, record.Estimated), "MalformedSnapshot").
		ok(record.Resumption(record.TranscriptSnapshot(inner), 1, record.Estimated)).
		done())

	c.Cases = append(c.Cases, newCase("c14-image-offered-for-transcript").
		ok(exec(1)).
		ok(record.Suspension(record.TranscriptSnapshot(inner), addr("manifest:x"))).
		refuse(record.Resumption(record.ImageSnapshot(inner, nil), 1, record.Estimated), "SnapshotMismatch").
		ok(record.Resumption(record.TranscriptSnapshot(inner), 1, record.Estimated)).
		done())
	c.Cases = append(c.Cases, newCase("c14-transcript-offered-for-image").
		ok(exec(1)).
		ok(record.Suspension(record.ImageSnapshot(inner, nil), addr("manifest:x"))).
		refuse(record.Resumption(record.TranscriptSnapshot(inner), 1, record.Estimated), "SnapshotMismatch").
		ok(record.Resumption(record.ImageSnapshot(inner, nil), 1, record.Estimated)).
		done())

	// Fixed addresses so the hex below can be written by hand.
	rep := func(b byte) record.Address {
		var a record.Address
		copy(a[:], bytes.Repeat([]byte{b}, 32))
		return a
	}
	h := func(b string) string { return strings.Repeat(b, 32) }
	pins := newCase("c14-canonical-pins").done()
	pins.Pins = []conformance.Pin{
		{Name: "suspended image, no memory", Segment: record.Suspension(record.ImageSnapshot(rep(0xbb), nil), rep(0xdd)),
			Hex: "02 01 " + h("bb") + " 00 " + h("dd")},
		{Name: "suspended image with memory", Segment: record.Suspension(record.ImageSnapshot(rep(0xbb), ptr(rep(0xcc))), rep(0xdd)),
			Hex: "02 01 " + h("bb") + " 01 " + h("cc") + " " + h("dd")},
		{Name: "resumed image", Segment: record.Resumption(record.ImageSnapshot(rep(0xbb), ptr(rep(0xcc))), 1000, record.Estimated),
			Hex: "03 01 " + h("bb") + " 01 " + h("cc") + " 00000000000003e8 02"},
		{Name: "suspended transcript", Segment: record.Suspension(record.TranscriptSnapshot(rep(0xee)), rep(0xdd)),
			Hex: "02 02 " + h("ee") + " " + h("dd")},
		{Name: "resumed image, no memory", Segment: record.Resumption(record.ImageSnapshot(rep(0xbb), nil), 1, record.Measured),
			Hex: "03 01 " + h("bb") + " 00 0000000000000001 01"},
		{Name: "resumed transcript", Segment: record.Resumption(record.TranscriptSnapshot(rep(0xee)), 0x0102030405060708, record.Estimated),
			Hex: "03 02 " + h("ee") + " 0102030405060708 02"},
		{Name: "closed", Segment: record.Closure("done"),
			Hex: "04 00000004 646f6e65"},
		{Name: "closed, empty reason", Segment: record.Closure(""),
			Hex: "04 00000000"},
		{Name: "closed, non-ASCII reason", Segment: record.Closure("é\u2028"),
			Hex: "04 00000005 c3a9 e280a8"},
	}
	c.Cases = append(c.Cases, pins)
	return c
}

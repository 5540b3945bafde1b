// Command gen writes the conformance vectors in testdata/conformance.
//
// Each case states the outcome its author intends; gen replays it against
// pkg/record and stops if the implementation disagrees, so a vector is never
// written from a behaviour nobody chose. Canonical pins are hex written out
// by hand here, not encoder output.
//
//	go run ./internal/conformance/gen [DIR]
package main

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log"
	"math"
	"os"
	"path/filepath"
	"strings"

	"github.com/runrecordd/runrecordd/internal/conformance"
	"github.com/runrecordd/runrecordd/pkg/record"
)

func main() {
	dir, sample := "testdata/conformance", "testdata/records/sample.json"
	if len(os.Args) > 1 {
		dir, sample = os.Args[1], filepath.Join(os.Args[1], "sample.json")
	}
	if err := os.WriteFile(sample, sampleRecord(), 0o644); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("wrote %s\n", sample)
	for _, c := range []conformance.Class{c6(), c14(), c15()} {
		if res := conformance.Run(c); !res.Passed() {
			log.Fatalf("%s: the implementation disagrees with the vectors: %s", c.Class, strings.Join(res.Failed, "; "))
		}
		b, err := json.MarshalIndent(c, "", "  ")
		if err != nil {
			log.Fatal(err)
		}
		name := filepath.Join(dir, strings.ToLower(c.Class)+".json")
		if err := os.WriteFile(name, append(b, '\n'), 0o644); err != nil {
			log.Fatal(err)
		}
		fmt.Printf("wrote %s (%d cases)\n", name, len(c.Cases))
	}
}

// addr names a test object by a label, as a real host names objects by
// their bytes.
func addr(label string) record.Address { return record.Sum([]byte(label)) }

func ptr(a record.Address) *record.Address { return &a }

// builder records a case's steps, stating each outcome.
type builder struct {
	c conformance.Case
	r *record.Record
}

func newCase(name string) *builder {
	u, g := addr("unit:"+name), addr("grants:"+name)
	return &builder{c: conformance.Case{Name: name, Unit: u, Grants: g}, r: record.New(u, g)}
}

// ok appends a segment that must be accepted.
func (b *builder) ok(s record.Segment) *builder {
	h, err := b.r.Append(s)
	if err != nil {
		log.Fatalf("%s: step %d: %v", b.c.Name, len(b.c.Steps), err)
	}
	b.c.Steps = append(b.c.Steps, conformance.Step{Segment: s, Expect: "ok", Head: ptr(h)})
	return b
}

// refuse appends a segment that must be refused with the named error.
func (b *builder) refuse(s record.Segment, want string) *builder {
	b.c.Steps = append(b.c.Steps, conformance.Step{Segment: s, Expect: want})
	return b
}

func (b *builder) done() conformance.Case {
	b.c.Head = ptr(b.r.Head())
	return b.c
}

func image(name string) record.Snapshot {
	return record.ImageSnapshot(addr("root:"+name), ptr(addr("memory:"+name)))
}

func transcript(name string) record.Snapshot {
	return record.TranscriptSnapshot(addr("transcript:" + name))
}

func exec(n int) record.Segment { return record.Execution(addr(fmt.Sprintf("attestation:%d", n)), nil) }

func u64(v uint64) *uint64 { return &v }

func intp(v int) *int { return &v }

func c6() conformance.Class {
	c := conformance.Class{Class: "C6", Description: "chain advance and verification across execute → suspend → resume → execute; forked snapshots refused; execution while parked refused; idle energy accumulates; a modified recorded snapshot fails verification through the wire form; appends after close refused"}

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
	c.Cases = append(c.Cases, lc)

	fork := image("a")
	fork.Memory = ptr(addr("memory:a-forked"))
	c.Cases = append(c.Cases, newCase("c6-forked-snapshot").
		ok(exec(1)).
		ok(record.Suspension(image("a"), addr("manifest:a"))).
		refuse(record.Resumption(fork, 1, record.Estimated), "SnapshotMismatch").
		refuse(record.Resumption(record.ImageSnapshot(addr("root:a"), nil), 1, record.Estimated), "SnapshotMismatch").
		ok(record.Resumption(image("a"), 1, record.Estimated)).
		done())

	c.Cases = append(c.Cases, newCase("c6-execution-while-parked").
		ok(exec(1)).
		ok(record.Suspension(image("a"), addr("manifest:a"))).
		refuse(exec(2), "Parked").
		refuse(record.Suspension(image("a"), addr("manifest:a")), "Parked").
		ok(record.Resumption(image("a"), 1, record.Estimated)).
		refuse(record.Resumption(image("a"), 1, record.Estimated), "NotParked").
		ok(exec(2)).
		done())

	tamper := newCase("c6-tampered-wire-snapshot").
		ok(exec(1)).
		ok(record.Suspension(image("a"), addr("manifest:a"))).
		ok(record.Resumption(image("a"), 10, record.Estimated))
	tc := tamper.done()
	wire := string(tamper.r.EncodeWire())
	tc.Wire = strings.Replace(wire, addr("memory:a").String(), addr("memory:evil").String(), 1)
	tc.WireExpect, tc.WireSegment = "HeadMismatch", intp(1)
	c.Cases = append(c.Cases, tc)

	both := tamper.done()
	both.Name = "c6-tampered-wire-both-snapshots"
	both.Wire = strings.ReplaceAll(wire, addr("memory:a").String(), addr("memory:evil").String())
	both.WireExpect, both.WireSegment = "HeadMismatch", intp(1)
	c.Cases = append(c.Cases, both)

	intact := tamper.done()
	intact.Name = "c6-intact-wire"
	intact.Wire, intact.WireExpect = wire, "ok"
	c.Cases = append(c.Cases, intact)

	c.Cases = append(c.Cases, newCase("c6-append-after-close").
		ok(exec(1)).
		ok(record.Closure("finished")).
		refuse(exec(2), "Closed").
		refuse(record.Suspension(image("a"), addr("manifest:a")), "Closed").
		refuse(record.Closure("again"), "Closed").
		done())

	// The spec: a host MUST NOT record a transcript park's idle_uj as
	// zero; runrecordd holds image parks to the same rule (a park always
	// retains something).
	c.Cases = append(c.Cases, newCase("c6-zero-idle").
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

	c.Cases = append(c.Cases, newCase("c6-close-while-parked").
		ok(exec(1)).
		ok(record.Suspension(image("a"), addr("manifest:a"))).
		ok(record.Closure("abandoned while parked")).
		refuse(record.Resumption(image("a"), 1, record.Estimated), "Closed").
		done())

	// Strict alternation: a park ends an executed interval, so a
	// Suspended segment follows an Executed one — never genesis, a
	// Resumed or another Suspended. Intervals may follow one another.
	c.Cases = append(c.Cases, newCase("c6-alternation").
		refuse(record.Suspension(image("a"), addr("manifest:a")), "Alternation").
		ok(exec(1)).
		ok(exec(2)).
		ok(record.Suspension(image("a"), addr("manifest:a"))).
		ok(record.Resumption(image("a"), 1, record.Estimated)).
		refuse(record.Suspension(image("b"), addr("manifest:a")), "Alternation").
		ok(exec(3)).
		ok(record.Suspension(image("b"), addr("manifest:a"))).
		done())

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
	c.Cases = append(c.Cases, oc)

	// The zero address names no object: refused wherever a segment
	// states an address.
	var zero record.Address
	c.Cases = append(c.Cases, newCase("c6-zero-addresses").
		refuse(record.Execution(zero, nil), "MalformedSegment").
		ok(exec(1)).
		refuse(record.Suspension(image("a"), zero), "MalformedSegment").
		refuse(record.Suspension(record.ImageSnapshot(zero, nil), addr("manifest:a")), "MalformedSnapshot").
		refuse(record.Suspension(record.ImageSnapshot(addr("root:a"), &zero), addr("manifest:a")), "MalformedSnapshot").
		refuse(record.Suspension(record.TranscriptSnapshot(zero), addr("manifest:a")), "MalformedSnapshot").
		ok(record.Suspension(image("a"), addr("manifest:a"))).
		done())

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
	} {
		if !strings.Contains(edWire, e.old) {
			log.Fatalf("c6-edited-wire-%s: %q not in the wire form", e.name, e.old)
		}
		w := edCase
		w.Name = "c6-edited-wire-" + e.name
		w.Wire, w.WireExpect, w.WireSegment = strings.Replace(edWire, e.old, e.new, 1), e.want, intp(e.seg)
		c.Cases = append(c.Cases, w)
	}
	zeroUnit := edCase
	zeroUnit.Name = "c6-edited-wire-zero-unit"
	zeroUnit.Wire, zeroUnit.WireExpect = strings.Replace(edWire, `"unit_id":"`+edCase.Unit.String(), `"unit_id":"`+zero.String(), 1), "Address"
	c.Cases = append(c.Cases, zeroUnit)

	// The empty record: its head is its genesis, its wire form has no
	// segment.
	empty := newCase("c6-empty-record")
	ec := empty.done()
	ec.Wire, ec.WireExpect = string(empty.r.EncodeWire()), "ok"
	c.Cases = append(c.Cases, ec)
	return c
}

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

func c15() conformance.Class {
	c := conformance.Class{Class: "C15", Description: "call accounts and the wait proof: each verdict; absent and empty accounts hash differently; an accounted trace is the transcript trace plus its accounts, and dropping the accounts reproduces the transcript trace's head"}
	acct := func(d, r []string) *record.CallAccount {
		return &record.CallAccount{Dispatched: d, Resolved: r}
	}
	ts := func(n string) record.Snapshot { return transcript(n) }
	trace := func(name string, accounts []*record.CallAccount) *builder {
		b := newCase(name)
		b.c.Unit, b.c.Grants = addr("unit:c15-trace"), addr("grants:c15-trace")
		b.r = record.New(b.c.Unit, b.c.Grants)
		for i, a := range accounts {
			b.ok(record.Execution(addr(fmt.Sprintf("attestation:%d", i)), a))
			if i < len(accounts)-1 {
				n := fmt.Sprintf("t%d", i)
				b.ok(record.Suspension(ts(n), addr("manifest:t")))
				b.ok(record.Resumption(ts(n), 50, record.Estimated))
			}
		}
		return b
	}
	verdict := func(b *builder, kind string, seg int) conformance.Case {
		c := b.done()
		c.WaitProof = &conformance.Verdict{Kind: kind, Segment: seg}
		return c
	}
	plain := trace("c15-transcript-trace", []*record.CallAccount{nil, nil, nil})
	plainCase := verdict(plain, "Unproved", 0)
	c.Cases = append(c.Cases, plainCase)

	accounted := trace("c15-accounted-trace", []*record.CallAccount{
		acct([]string{"build-1", "review-1"}, nil),
		acct([]string{"build-2"}, []string{"build-1"}),
		acct(nil, []string{"review-1", "build-2"}),
	})
	ac := verdict(accounted, "NonBlocking", -1)
	ac.StrippedHead = plainCase.Head
	ac.Differs = plainCase.Head
	c.Cases = append(c.Cases, ac)

	c.Cases = append(c.Cases,
		verdict(trace("c15-blocked", []*record.CallAccount{
			acct([]string{"a"}, nil),
			acct([]string{"b"}, []string{"a", "b"}),
		}), "Blocked", 3),
		verdict(trace("c15-malformed-never-dispatched", []*record.CallAccount{
			acct([]string{"a"}, nil),
			acct(nil, []string{"ghost"}),
		}), "Malformed", 3),
		verdict(trace("c15-malformed-resolved-twice", []*record.CallAccount{
			acct([]string{"a"}, nil),
			acct(nil, []string{"a"}),
			acct(nil, []string{"a"}),
		}), "Malformed", 6),
		verdict(trace("c15-malformed-dispatched-twice", []*record.CallAccount{
			acct([]string{"a"}, nil),
			acct([]string{"a"}, nil),
		}), "Malformed", 3),
		verdict(trace("c15-unproved-unaccounted-interval", []*record.CallAccount{
			acct([]string{"a"}, nil),
			nil,
			acct(nil, []string{"a"}),
		}), "Unproved", 3),
		// With strict alternation a record without an Executed segment
		// is empty or closed before it ran.
		verdict(newCase("c15-unproved-no-intervals").
			refuse(record.Suspension(ts("x"), addr("manifest:t")), "Alternation").
			ok(record.Closure("cancelled before it ran")), "Unproved", -1),
	)

	// An id twice in one list is refused at append; an id in both lists
	// of one segment, or dispatched in two segments, is the wait proof's.
	c.Cases = append(c.Cases, verdict(newCase("c15-duplicate-in-one-list").
		refuse(record.Execution(addr("attestation:0"), acct([]string{"a", "b", "a"}, nil)), "MalformedSegment").
		refuse(record.Execution(addr("attestation:0"), acct([]string{"a"}, []string{"z", "z"})), "MalformedSegment").
		ok(record.Execution(addr("attestation:0"), acct([]string{"a"}, []string{"a"}))), "Blocked", 0))

	// Strings in the wire form: control characters, U+2028/U+2029, DEL,
	// non-ASCII and HTML characters, written as docs/record-format.md says.
	esc := newCase("c15-wire-strings").
		ok(record.Execution(addr("attestation:0"), acct([]string{"é\u2028<&>", "tab\there"}, nil))).
		ok(record.Closure("a\u2029b\bc\fd\x1fe\x7ff \"q\" \\ \n\r\x00"))
	escWire := string(esc.r.EncodeWire())
	for _, frag := range []string{`"é\u2028<&>"`, `"tab\there"`, `"a\u2029b\bc\fd\u001fe` + "\x7f" + `f \"q\" \\ \n\r\u0000"`} {
		if !strings.Contains(escWire, frag) {
			log.Fatalf("c15-wire-strings: %s not in %s", frag, escWire)
		}
	}
	escCase := esc.done()
	escCase.Wire, escCase.WireExpect = escWire, "ok"
	c.Cases = append(c.Cases, escCase)
	for _, e := range []struct{ name, old, new string }{
		{"escaped-non-ascii", "é", `\u00e9`},
		{"uppercase-hex", `\u001f`, `\u001F`},
		{"u0008-for-b", `\b`, `\u0008`},
		{"raw-u2028", `\u2028`, "\u2028"},
	} {
		w := escCase
		w.Name = "c15-wire-strings-" + e.name
		w.Wire = strings.Replace(escWire, e.old, e.new, 1)
		w.WireExpect = "Canonical"
		seg := 0
		if strings.Index(escWire, e.old) > strings.Index(escWire, `"kind":"closed"`) {
			seg = 1
		}
		w.WireSegment = intp(seg)
		c.Cases = append(c.Cases, w)
	}

	absent := newCase("c15-absent-account").ok(record.Execution(addr("attestation:0"), nil)).done()
	empty := newCase("c15-empty-account")
	empty.c.Unit, empty.c.Grants = absent.Unit, absent.Grants
	empty.r = record.New(absent.Unit, absent.Grants)
	ec := empty.ok(record.Execution(addr("attestation:0"), &record.CallAccount{})).done()
	ec.Differs = absent.Head
	ec.StrippedHead = absent.Head
	att := addr("attestation:0")
	raw := hex.EncodeToString(att[:])
	ec.Pins = []conformance.Pin{
		{Name: "absent account", Segment: record.Execution(addr("attestation:0"), nil),
			Hex: "01 " + raw + " 00"},
		{Name: "empty account", Segment: record.Execution(addr("attestation:0"), &record.CallAccount{}),
			Hex: "01 " + raw + " 01 00000000 00000000"},
		{Name: "two dispatched, one resolved", Segment: record.Execution(addr("attestation:0"), acct([]string{"ab", "c"}, []string{"x"})),
			Hex: "01 " + raw + " 01 00000002 00000002 6162 00000001 63 00000001 00000001 78"},
	}
	c.Cases = append(c.Cases, absent, ec)
	return c
}

// sampleRecord is a finished run in wire form: an image park, then a
// transcript park waiting on a call, resolved after resuming.
func sampleRecord() []byte {
	b := newCase("sample").
		ok(record.Execution(addr("attestation:1"), &record.CallAccount{})).
		ok(record.Suspension(image("s"), addr("manifest:s"))).
		ok(record.Resumption(image("s"), 2_000_000, record.Estimated)).
		ok(record.Execution(addr("attestation:2"), &record.CallAccount{Dispatched: []string{"review-1"}})).
		ok(record.Suspension(transcript("s"), addr("manifest:t"))).
		ok(record.Resumption(transcript("s"), 3_000, record.Estimated)).
		ok(record.Execution(addr("attestation:3"), &record.CallAccount{Resolved: []string{"review-1"}})).
		ok(record.Closure("finished"))
	return b.r.EncodeWire()
}

package main

import (
	"encoding/hex"
	"fmt"
	"log"
	"strings"

	"github.com/runrecordd/runrecordd/internal/conformance"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// c15 is class C15: call accounts and the wait proof. Its cases are built
// in the steps below, in the order the vector file lists them.
func c15() conformance.Class {
	c := conformance.Class{Class: "C15", Description: "call accounts and the wait proof: each verdict; absent and empty accounts hash differently; an accounted trace is the transcript trace plus its accounts, and dropping the accounts reproduces the transcript trace's head"}
	c.Cases = append(c.Cases, c15Verdicts()...)
	c.Cases = append(c.Cases, c15WireStrings()...)
	c.Cases = append(c.Cases, c15Accounts()...)
	return c
}

// acct is a call account of dispatched and resolved ids.
func acct(d, r []string) *record.CallAccount {
	return &record.CallAccount{Dispatched: d, Resolved: r}
}

// trace is a case of one executed interval per account, each but the last
// parked by transcript and resumed. Every trace shares one unit and grant
// set, so traces that differ only in their accounts can be compared.
func trace(name string, accounts []*record.CallAccount) *builder {
	b := newCase(name)
	b.c.Unit, b.c.Grants = addr("unit:c15-trace"), addr("grants:c15-trace")
	b.r = record.New(b.c.Unit, b.c.Grants)
	for i, a := range accounts {
		b.ok(record.Execution(addr(fmt.Sprintf("attestation:%d", i)), a))
		if i < len(accounts)-1 {
			n := fmt.Sprintf("t%d", i)
			b.ok(record.Suspension(transcript(n), addr("manifest:t")))
			b.ok(record.Resumption(transcript(n), 50, record.Estimated))
		}
	}
	return b
}

// verdict ends b's case, stating the wait proof's verdict on it.
func verdict(b *builder, kind string, seg int) conformance.Case {
	c := b.done()
	c.WaitProof = &conformance.Verdict{Kind: kind, Segment: seg}
	return c
}

// c15Verdicts: a trace for each of the wait proof's verdicts, and an
// accounted trace whose stripped head is the transcript trace's.
func c15Verdicts() []conformance.Case {
	var cases []conformance.Case
	plain := trace("c15-transcript-trace", []*record.CallAccount{nil, nil, nil})
	plainCase := verdict(plain, "Unproved", 0)
	cases = append(cases, plainCase)

	accounted := trace("c15-accounted-trace", []*record.CallAccount{
		acct([]string{"build-1", "review-1"}, nil),
		acct([]string{"build-2"}, []string{"build-1"}),
		acct(nil, []string{"review-1", "build-2"}),
	})
	ac := verdict(accounted, "NonBlocking", -1)
	ac.StrippedHead = plainCase.Head
	ac.Differs = plainCase.Head
	cases = append(cases, ac)

	cases = append(cases,
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
			refuse(record.Suspension(transcript("x"), addr("manifest:t")), "Alternation").
			ok(record.Closure("cancelled before it ran")), "Unproved", -1),
	)

	// An id twice in one list is refused at append; an id in both lists
	// of one segment, or dispatched in two segments, is the wait proof's.
	cases = append(cases, verdict(newCase("c15-duplicate-in-one-list").
		refuse(record.Execution(addr("attestation:0"), acct([]string{"a", "b", "a"}, nil)), "MalformedSegment").
		refuse(record.Execution(addr("attestation:0"), acct([]string{"a"}, []string{"z", "z"})), "MalformedSegment").
		ok(record.Execution(addr("attestation:0"), acct([]string{"a"}, []string{"a"}))), "Blocked", 0))
	return cases
}

// c15WireStrings: strings in the wire form, and edits of their escapes
// that are not canonical.
func c15WireStrings() []conformance.Case {
	var cases []conformance.Case
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
	cases = append(cases, escCase)
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
		cases = append(cases, w)
	}
	return cases
}

// c15Accounts: an absent and an empty call account hash differently, and
// their bytes are pinned by hand.
func c15Accounts() []conformance.Case {
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
	return []conformance.Case{absent, ec}
}

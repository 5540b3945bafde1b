package bundle_test

import (
	"errors"
	"testing"

	"github.com/runrecordd/runrecordd/internal/bundle"
)

// Exports: a failed export takes its handoff back only when it made it,
// none other is streaming, and none was delivered whole; a delivered one
// reports the handoff; a copy changes nothing.
func TestExports(t *testing.T) {
	st, _ := mustStore(t)
	b := forge(t, nil)
	mustImport(t, st, b.Tar(nil), iopts())
	var e bundle.Exports
	failed := errors.New("the reader went away")
	handedOff := func() bool {
		_, off, _ := st.HandedOff("forged")
		return off
	}
	begin := func(handoff bool) (bundle.ExportOptions, bool) {
		t.Helper()
		o, made, err := e.Begin(st, "forged", handoff)
		if err != nil {
			t.Fatal(err)
		}
		return o, made
	}
	end := func(o bundle.ExportOptions, made bool, err error, want bundle.Ended) {
		t.Helper()
		if got, rerr := e.End(st, "forged", o, made, err); got != want || rerr != nil {
			t.Fatalf("ended %v (%v), want %v", got, rerr, want)
		}
	}

	// One export, failed: taken back.
	o, made := begin(true)
	end(o, made, failed, bundle.TakenBack)
	if handedOff() {
		t.Fatal("a failed export left the run handed off")
	}
	// Two at once, the first fails while the second streams: kept; the
	// second delivers: the run stays handed off.
	o1, m1 := begin(true)
	o2, m2 := begin(true)
	if !m1 || m2 {
		t.Fatalf("made %v, %v: the handoff is made once", m1, m2)
	}
	end(o1, m1, failed, bundle.Kept)
	end(o2, m2, nil, bundle.Kept)
	if !handedOff() {
		t.Fatal("a delivered export's handoff was taken back")
	}
	// Delivered once: a later failure keeps the handoff (a bundle is out).
	o, made = begin(true)
	end(o, made, failed, bundle.Kept)
	if !handedOff() {
		t.Fatal("a failure after a delivery took the handoff back")
	}
	// A copy, and a fresh store's delivered handoff.
	cp, _ := mustStore(t)
	mustImport(t, cp, b.Tar(nil), iopts())
	var f bundle.Exports
	oc, mc, err := f.Begin(cp, "forged", false)
	if err != nil || mc || !oc.Copy {
		t.Fatalf("a copy: %+v %v %v", oc, mc, err)
	}
	if got, _ := f.End(cp, "forged", oc, mc, failed); got != bundle.Kept {
		t.Fatalf("a failed copy: %v", got)
	}
	oh, mh, _ := f.Begin(cp, "forged", true)
	if got, _ := f.End(cp, "forged", oh, mh, nil); got != bundle.HandedOff {
		t.Fatalf("a delivered handoff: %v", got)
	}
}

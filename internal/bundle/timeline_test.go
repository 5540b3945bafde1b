package bundle_test

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/bundletest"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// timelineCase is an import judged against a run the store holds (one
// timeline per run, docs/trust.md).
type timelineCase struct {
	held    func(t *testing.T, st *store.Store) // what the store holds first
	tar     func(t *testing.T) []byte
	id      string // the id asked for
	reclaim bool
	want    error // nil: accepted, and check holds
	check   func(t *testing.T, st *store.Store, im bundle.Imported)
}

// hold imports the bundle tar gives into st, handed off afterwards if
// off.
func hold(tar func(t *testing.T) []byte, o bundle.ImportOptions, off bool) func(t *testing.T, st *store.Store) {
	return func(t *testing.T, st *store.Store) {
		im := mustImport(t, st, tar(t), o)
		if off {
			if err := st.HandOff(im.Run, im.Record.Head()); err != nil {
				t.Fatal(err)
			}
		}
	}
}

func plainRun(t *testing.T) *bundletest.Bundle { return forge(t, nil) }
func oneOn(t *testing.T) *bundletest.Bundle    { return extend(t, forge(t, nil), "{\"t\":2}\n") }

// tarOf is b's bundle; copyOf, marked a copy.
func tarOf(b func(t *testing.T) *bundletest.Bundle) func(t *testing.T) []byte {
	return func(t *testing.T) []byte { return b(t).Tar(nil) }
}

func copyOf(b func(t *testing.T) *bundletest.Bundle) func(t *testing.T) []byte {
	return func(t *testing.T) []byte { return b(t).Tar(func(h *bundle.Header) { h.Copy = true }) }
}

// held checks how st holds the run after an accepted import.
func held(extended, off, copy bool, len int) func(t *testing.T, st *store.Store, im bundle.Imported) {
	return func(t *testing.T, st *store.Store, im bundle.Imported) {
		h, isOff, _ := st.HandedOff(im.Run)
		r, _ := st.Run(im.Run)
		ret, _ := st.RetentionOf(im.Run)
		if im.Extended != extended || isOff != off || h.Copy != copy || r.Len != len || ret.ImportedLen != len {
			t.Fatalf("extended %v, handed off %v (%+v), %d segments (%d imported)", im.Extended, isOff, h, r.Len, ret.ImportedLen)
		}
		sameRecord(t, st, im.Run, im.Record)
	}
}

func timelineCases() map[string]timelineCase {
	o := iopts()
	handedOff, here := hold(tarOf(plainRun), o, true), hold(tarOf(plainRun), o, false)
	other := func(t *testing.T) []byte {
		return forge(t, func(r *bundletest.Run) { r.Spec = spec("other") }).Tar(nil)
	}
	diverged := func(t *testing.T) []byte { return extend(t, forge(t, nil), "{\"t\":3}\n").Tar(nil) }
	untrusted := func(t *testing.T) []byte {
		ext, err := forge(t, nil).Extend(untrustedKey, []byte("{\"t\":2}\n"))
		if err != nil {
			t.Fatal(err)
		}
		return ext.Tar(nil)
	}
	mounted := func(t *testing.T) *bundletest.Bundle {
		return forge(t, func(r *bundletest.Run) { r.Grants.ReadOnly = []unit.Mount{{Source: "/etc", Target: "/m"}} })
	}
	return map[string]timelineCase{
		"handed off, taken back one interval on":    {held: handedOff, tar: tarOf(oneOn), check: held(true, false, false, 5)},
		"handed off, the same bundle":               {held: handedOff, tar: tarOf(plainRun), want: store.ErrNotExtension},
		"handed off, the same bundle, reclaimed":    {held: handedOff, tar: tarOf(plainRun), reclaim: true, check: held(true, false, false, 2)},
		"handed off, another run under its id":      {held: handedOff, tar: other, want: store.ErrNotExtension},
		"handed off, a shorter record":              {held: hold(tarOf(oneOn), o, true), tar: tarOf(plainRun), reclaim: true, want: store.ErrNotExtension},
		"handed off, another timeline":              {held: hold(tarOf(oneOn), o, true), tar: diverged, want: store.ErrNotExtension},
		"handed off, an untrusted interval":         {held: handedOff, tar: untrusted, want: attest.ErrUntrusted},
		"held here, the same bundle":                {held: here, tar: tarOf(plainRun), reclaim: true, want: store.ErrRunExists},
		"held here, one interval on":                {held: here, tar: tarOf(oneOn), want: store.ErrRunExists},
		"held here, a copy of it":                   {held: here, tar: copyOf(plainRun), want: store.ErrRunExists},
		"held here, under another id":               {held: here, tar: tarOf(plainRun), id: "again", want: store.ErrGenesisHeld},
		"handed off, under another id":              {held: handedOff, tar: tarOf(oneOn), id: "again", want: store.ErrGenesisHeld},
		"a copy":                                    {held: func(*testing.T, *store.Store) {}, tar: copyOf(plainRun), check: held(false, true, true, 2)},
		"a copy, then its handoff":                  {held: hold(copyOf(plainRun), o, false), tar: tarOf(plainRun), check: held(true, false, false, 2)},
		"a copy, then a copy one interval on":       {held: hold(copyOf(plainRun), o, false), tar: copyOf(oneOn), check: held(true, true, true, 5)},
		"its own grants, handed off, come back":     {held: hold(tarOf(mounted), iopts("/etc"), true), tar: tarOf(mounted), reclaim: true, check: held(true, false, false, 2)},
		"its own grants, held here, are judged":     {held: hold(tarOf(mounted), iopts("/etc"), false), tar: tarOf(mounted), reclaim: true, want: bundle.ErrPolicy},
		"grants never granted here are judged":      {held: func(*testing.T, *store.Store) {}, tar: tarOf(mounted), want: bundle.ErrPolicy},
		"grants of another run held off are judged": {held: handedOff, tar: tarOf(mounted), id: "x", want: bundle.ErrPolicy},
	}
}

// Each way a bundle meets a run the store holds: taken back (extended or
// reclaimed), held as a copy or made the run, or refused leaving the
// store as it was.
func TestImportTimeline(t *testing.T) {
	for name, c := range timelineCases() {
		t.Run(name, func(t *testing.T) {
			st, dir := mustStore(t)
			c.held(t, st)
			before := stateOf(t, st, dir)
			o := iopts()
			o.ID, o.Reclaim = c.id, c.reclaim
			im, err := bundle.Import(context.Background(), st, bytes.NewReader(c.tar(t)), o)
			if c.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				c.check(t, st, im)
				stateOf(t, st, dir)
				return
			}
			if !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			t.Log(err)
			if after := stateOf(t, st, dir); after != before {
				t.Fatalf("refused import changed the store:\n%s\nwas\n%s", after, before)
			}
		})
	}
}

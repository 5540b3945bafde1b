package bundle_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/bundletest"
)

// tar2 is b as a format-2 bundle: bundle.json declaring b's objects (then
// changed by adjust when not nil), record.json, then members (raw tar
// blocks), then the tar's end.
func tar2(b *bundletest.Bundle, adjust func(*bundle.Header), members ...[]byte) []byte {
	h := bundle.Header{Format: bundle.Format2, Run: b.Run, Objects: len(b.Objects), Bytes: bytesOf(b)}
	if adjust != nil {
		adjust(&h)
	}
	hb, _ := json.Marshal(h)
	out := bundletest.Member("bundle.json", hb)
	out = append(out, bundletest.Member("record.json", b.Record.EncodeWire())...)
	for _, m := range members {
		out = append(out, m...)
	}
	return append(out, make([]byte, 1024)...)
}

// packOf is a pack carrying objs in order.
func packOf(objs ...[]byte) []byte {
	var p []byte
	for _, o := range objs {
		p = bundle.AppendPack(p, o)
	}
	return p
}

// all is b's objects' bytes, in b's order.
func all(b *bundletest.Bundle) [][]byte {
	var out [][]byte
	for _, o := range b.Objects {
		out = append(out, o.Bytes)
	}
	return out
}

// A format-2 bundle stages and adopts whole: its objects in one pack, or
// split among packs and objects/ members in any mix, each after its refs.
func TestStagePacked(t *testing.T) {
	b := forge(t, nil)
	objs := all(b)
	last := b.Objects[len(b.Objects)-1]
	for name, raw := range map[string][]byte{
		"one pack": tar2(b, nil, bundletest.Member("pack/0", packOf(objs...))),
		"packs and a member": tar2(b, nil, bundletest.Member("pack/0", packOf(objs[:1]...)),
			bundletest.Member("pack/1", packOf(objs[1:len(objs)-1]...)), bundletest.Member(bundletest.Name(last.Addr), last.Bytes)),
		"a pack per object": func() []byte {
			var ms [][]byte
			for i, o := range objs {
				ms = append(ms, bundletest.Member("pack/"+string(rune('0'+i)), packOf(o)))
			}
			return tar2(b, nil, ms...)
		}(),
	} {
		t.Run(name, func(t *testing.T) {
			st, _ := mustStore(t)
			sb, err := bundle.Stage(context.Background(), st, bytes.NewReader(raw), opts())
			if err != nil {
				t.Fatal(err)
			}
			defer sb.Close()
			if sb.Header.Format != bundle.Format2 || sb.Objects != len(b.Objects) || sb.Bytes != bytesOf(b) {
				t.Fatalf("%+v: %d objects of %d bytes", sb.Header, sb.Objects, sb.Bytes)
			}
			if err := sb.Adopt(context.Background(), st); err != nil {
				t.Fatal(err)
			}
			for _, o := range b.Objects {
				if !st.Has(o.Addr) {
					t.Fatalf("%s not stored", o.Addr)
				}
			}
		})
	}
}

// A pack member is hostile input like any other: each way of getting one
// wrong is refused with its typed error, naming why, and the refused
// bundle leaves nothing behind.
func TestStagePackRefuses(t *testing.T) {
	b := forge(t, nil)
	objs := all(b)
	pack := packOf(objs...)
	whole := func(p []byte) []byte { return tar2(b, nil, bundletest.Member("pack/0", p)) }
	bigger := func(n int64) func(h *bundle.Header) { return func(h *bundle.Header) { h.Objects++; h.Bytes += n } }
	extra := forge(t, func(r *bundletest.Run) { r.Spec = spec("other") }).Objects[0].Bytes
	att := b.Object(b.Record.Segment(0).Attestation)
	attFirst := [][]byte{att}
	for _, o := range objs {
		if !bytes.Equal(o, att) {
			attFirst = append(attFirst, o)
		}
	}
	for name, c := range map[string]struct {
		raw  []byte
		lim  bundle.Limits
		want error
		why  string
	}{
		"stream cut inside a pack": {raw: whole(pack)[:len(tar2(b, nil))-1024+512+len(pack)/2], want: bundle.ErrMalformed, why: "unexpected EOF"},
		"length past the member's end": {raw: tar2(b, bigger(100), bundletest.Member("pack/0", append(pack, 100, 'x'))),
			want: bundle.ErrMalformed, why: "the member has 1 left"},
		"member ends inside a length": {raw: tar2(b, bigger(200), bundletest.Member("pack/0", append(pack, 0xc8))),
			want: bundle.ErrMalformed, why: "ends inside a length"},
		"overlong length": {raw: tar2(b, bigger(1), bundletest.Member("pack/0", append(pack, 0x81, 0x00, 'x'))),
			want: bundle.ErrMalformed, why: "more bytes than it needs"},
		"overlong zero length": {raw: tar2(b, bigger(0), bundletest.Member("pack/0", append(pack, 0x80, 0x00))),
			want: bundle.ErrMalformed, why: "more bytes than it needs"},
		"length of four bytes": {raw: tar2(b, bigger(1), bundletest.Member("pack/0", append(pack, 0x81, 0x80, 0x80, 0x00, 'x'))),
			want: bundle.ErrMalformed, why: "a length of more than 3 bytes"},
		"length of ten bytes": {raw: tar2(b, bigger(1), bundletest.Member("pack/0", append(pack, bytes.Repeat([]byte{0xff}, 9)...))),
			want: bundle.ErrMalformed, why: "a length of more than 3 bytes"},
		"packed object over the threshold": {raw: tar2(b, bigger(bundle.PackObject+1),
			bundletest.Member("pack/0", append(binary.AppendUvarint(pack, bundle.PackObject+1), make([]byte, bundle.PackObject+1)...))),
			want: bundle.ErrMalformed, why: "over the 1048576 a pack carries"},
		"packed object over the limit": {raw: whole(pack), lim: bundle.Limits{Object: 64}, want: bundle.ErrLimit, why: "the limit is 64"},
		"duplicate in a pack": {raw: tar2(b, bigger(int64(len(objs[0]))), bundletest.Member("pack/0", packOf(slices.Concat(objs[:1], objs)...))),
			want: bundle.ErrMalformed, why: "twice"},
		"duplicate of a member": {raw: tar2(b, bigger(int64(len(objs[0]))), bundletest.Member(bundletest.Name(b.Objects[0].Addr), objs[0]),
			bundletest.Member("pack/0", pack)), want: bundle.ErrMalformed, why: "twice"},
		"object before its refs": {raw: whole(packOf(attFirst...)),
			want: bundle.ErrMalformed, why: "which it refers to"},
		"more objects than declared": {raw: tar2(b, func(h *bundle.Header) { h.Objects-- }, bundletest.Member("pack/0", pack)),
			want: bundle.ErrMalformed, why: "more than the"},
		"more bytes than declared": {raw: tar2(b, func(h *bundle.Header) { h.Bytes-- }, bundletest.Member("pack/0", pack)),
			want: bundle.ErrMalformed, why: "larger than what bundle.json declares is left"},
		"fewer objects than declared": {raw: tar2(b, nil, bundletest.Member("pack/0", packOf(objs[:len(objs)-1]...))),
			want: bundle.ErrMalformed, why: "bundle.json declares"},
		"pack larger than declared could take": {raw: tar2(b, func(h *bundle.Header) { h.Bytes = 0; h.Objects = 1 }, bundletest.Member("pack/0", pack)),
			want: bundle.ErrMalformed, why: "could take"},
		"pack over its limit": {raw: tar2(b, bigger(1<<30), bundletest.Header("pack/0", bundle.PackMax+1, '0')),
			want: bundle.ErrLimit, why: "the limit of a pack"},
		"empty pack":          {raw: tar2(b, nil, bundletest.Member("pack/0", nil), bundletest.Member("pack/1", pack)), want: bundle.ErrMalformed, why: "is empty"},
		"a link named pack/0": {raw: tar2(b, nil, bundletest.Header("pack/0", 0, '2')), want: bundle.ErrMalformed, why: "has type"},
		"a directory pack/0":  {raw: tar2(b, nil, bundletest.Header("pack/0", 0, '5')), want: bundle.ErrMalformed, why: "has type"},
		"a sparse pack": {raw: tar2(b, bigger(64<<20), bundletest.Sparse("pack/0", 64<<20)),
			want: bundle.ErrMalformed, why: "PAX record"},
		"pack/1 first": {raw: tar2(b, nil, bundletest.Member("pack/1", pack)), want: bundle.ErrMalformed, why: "pack/0 was expected"},
		"pack/00":      {raw: tar2(b, nil, bundletest.Member("pack/00", pack)), want: bundle.ErrMalformed, why: "pack/0 was expected"},
		"pack/0/x":     {raw: tar2(b, nil, bundletest.Member("pack/0/x", pack)), want: bundle.ErrMalformed, why: "pack/0 was expected"},
		"pack/+0":      {raw: tar2(b, nil, bundletest.Member("pack/+0", pack)), want: bundle.ErrMalformed, why: "pack/0 was expected"},
		"pack/0 twice": {raw: tar2(b, nil, bundletest.Member("pack/0", packOf(objs[:1]...)), bundletest.Member("pack/0", packOf(objs[1:]...))),
			want: bundle.ErrMalformed, why: "pack/1 was expected"},
		"pack in a format-1 bundle": {raw: tar2(b, func(h *bundle.Header) { h.Format = bundle.Format1 }, bundletest.Member("pack/0", pack)),
			want: bundle.ErrMalformed, why: "unexpected member"},
		"packed object the record does not reach": {raw: tar2(b, bigger(int64(len(extra))), bundletest.Member("pack/0", packOf(slices.Concat(objs, [][]byte{extra})...))),
			want: bundle.ErrMalformed, why: "not one the record reaches"},
		"format 3": {raw: tar2(b, func(h *bundle.Header) { h.Format = "runrecordd.bundle/3" }, bundletest.Member("pack/0", pack)),
			want: bundle.ErrMalformed, why: "this daemon reads"},
	} {
		t.Run(name, func(t *testing.T) {
			st, dir := mustStore(t)
			o := opts()
			o.Limits = c.lim
			_, err := bundle.Stage(context.Background(), st, bytes.NewReader(c.raw), o)
			if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.why) {
				t.Fatalf("got %v, want %v (%s)", err, c.want, c.why)
			}
			t.Log(err)
			if n, size := objects(t, dir); n != 0 || size != 0 {
				t.Fatalf("refused bundle left %d objects, %d bytes", n, size)
			}
		})
	}
}

// ReadPack gives back the objects AppendPack packed, a zero-length one
// and one of PackObject bytes included, and refuses a pack cut short.
func TestReadPack(t *testing.T) {
	objs := [][]byte{[]byte("a"), {}, bytes.Repeat([]byte{7}, 200), make([]byte, bundle.PackObject)}
	p := packOf(objs...)
	var got [][]byte
	if err := bundle.ReadPack(bytes.NewReader(p), int64(len(p)), func(b []byte) error { got = append(got, bytes.Clone(b)); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(objs) {
		t.Fatalf("%d objects, want %d", len(got), len(objs))
	}
	for i := range objs {
		if !bytes.Equal(got[i], objs[i]) {
			t.Fatalf("object %d differs", i)
		}
	}
	// 200 is c8 01: two bytes of length.
	if !bytes.Equal(p[:6], []byte{1, 'a', 0, 0xc8, 1, 7}) {
		t.Fatalf("% x", p[:6])
	}
	err := bundle.ReadPack(bytes.NewReader(p), int64(len(p))+1, func([]byte) error { return nil })
	if !errors.Is(err, bundle.ErrMalformed) || !strings.Contains(err.Error(), "unexpected EOF") {
		t.Fatalf("a pack declared one byte longer than its stream: %v", err)
	}
}

// FuzzReadPack decodes arbitrary packs: it never panics, never hands fn an
// object over PackObject, and a pack it accepts is exactly the packing of
// the objects it gave (one spelling per pack), while anything else is
// ErrMalformed.
func FuzzReadPack(f *testing.F) {
	f.Add(packOf([]byte("a"), []byte{}, bytes.Repeat([]byte{7}, 200)))
	f.Add(packOf(make([]byte, 1<<14)))
	f.Add(packOf(all(forge(f, nil))...))
	f.Add([]byte{0x80, 0x00})
	f.Add([]byte{0xc8})
	f.Add([]byte{0x81, 0x80, 0x80, 0x00})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, p []byte) {
		var again []byte
		err := bundle.ReadPack(bytes.NewReader(p), int64(len(p)), func(b []byte) error {
			if len(b) > bundle.PackObject {
				t.Fatalf("an object of %d bytes", len(b))
			}
			again = bundle.AppendPack(again, b)
			return nil
		})
		if err != nil {
			if !errors.Is(err, bundle.ErrMalformed) {
				t.Fatalf("refused with %v", err)
			}
			return
		}
		if !bytes.Equal(again, p) {
			t.Fatalf("accepted % x, which packs back as % x", p, again)
		}
	})
}

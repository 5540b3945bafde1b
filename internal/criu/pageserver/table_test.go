package pageserver

import (
	"bytes"
	"errors"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/record"
)

func encode(t testing.TB, m *Table) []byte {
	var b bytes.Buffer
	if err := m.Encode(&b); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

func TestTableRoundTrip(t *testing.T) {
	m := newFixture(t).m
	b := encode(t, m)
	got, err := Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(encode(t, got), b) {
		t.Fatal("decoded extent table encodes to other bytes")
	}
	if e := got.Tasks[0].Extents[1]; e.Vaddr != 0x12000 || e.Size != PageSize || e.Verify == nil || *e.Verify != *m.Tasks[0].Extents[1].Verify {
		t.Fatalf("extent 1 decoded as %+v", e)
	}
}

// TestTableBytes pins the encoding of a one-extent extent table.
func TestTableBytes(t *testing.T) {
	a := record.Sum([]byte("x"))
	m := &Table{Tasks: []Task{{ID: 1, Extents: []Extent{{Vaddr: 0x1000, Size: 0x2000, Path: "/p", Verify: &a}}}}}
	want := tableMagic + "\x00\x00\x00\x01" + // one task
		"\x00\x00\x00\x00\x00\x00\x00\x01" + "\x00\x00\x00\x01" + // id 1, one extent
		"\x00\x00\x00\x00\x00\x00\x10\x00" + "\x00\x00\x00\x00\x00\x00\x20\x00" + "\x00\x00\x00\x00\x00\x00\x00\x00" + // vaddr, size, offset
		"\x01" + string(a[:]) + "\x00\x02/p"
	if got := encode(t, m); string(got) != want {
		t.Fatalf("encoded\n%x\nwant\n%x", got, want)
	}
}

func TestTableRefused(t *testing.T) {
	a := record.Sum(nil)
	ext := func(v, size, off uint64, verify bool) Extent {
		e := Extent{Vaddr: v, Size: size, Offset: off, Path: "/p"}
		if verify {
			e.Verify = &a
		}
		return e
	}
	for name, m := range map[string]*Table{
		"an empty extent":              {Tasks: []Task{{ID: 1, Extents: []Extent{ext(0x1000, 0, 0, false)}}}},
		"part of a page":               {Tasks: []Task{{ID: 1, Extents: []Extent{ext(0x1000, 100, 0, false)}}}},
		"an address inside a page":     {Tasks: []Task{{ID: 1, Extents: []Extent{ext(0x1010, PageSize, 0, false)}}}},
		"overlapping extents":          {Tasks: []Task{{ID: 1, Extents: []Extent{ext(0x1000, 2*PageSize, 0, false), ext(0x2000, PageSize, 0, false)}}}},
		"extents out of order":         {Tasks: []Task{{ID: 1, Extents: []Extent{ext(0x5000, PageSize, 0, false), ext(0x2000, PageSize, 0, false)}}}},
		"past the address space":       {Tasks: []Task{{ID: 1, Extents: []Extent{ext(^uint64(0)-PageSize+1, 2*PageSize, 0, false)}}}},
		"a verified extent over 1 MiB": {Tasks: []Task{{ID: 1, Extents: []Extent{ext(0x1000, MaxExtentSize+PageSize, 0, true)}}}},
		"a task twice":                 {Tasks: []Task{{ID: 1}, {ID: 1}}},
		"no path":                      {Tasks: []Task{{ID: 1, Extents: []Extent{{Vaddr: 0x1000, Size: PageSize}}}}},
	} {
		if err := m.Encode(&bytes.Buffer{}); !errors.Is(err, ErrTable) {
			t.Errorf("%s: encoded (%v)", name, err)
		}
	}
	good := encode(t, newFixture(t).m)
	for name, b := range map[string][]byte{
		"no magic":         append([]byte("rr-pageserver-2\n"), good[len(tableMagic):]...),
		"truncated":        good[:len(good)-1],
		"a byte past":      append(append([]byte{}, good...), 0),
		"a flag of 2":      bytes.Replace(good, []byte{0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, []byte{0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2}, 1),
		"empty":            nil,
		"too many tasks":   append([]byte(tableMagic), 0xff, 0xff, 0xff, 0xff),
		"too many extents": append([]byte(tableMagic), 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff),
	} {
		if _, err := Decode(bytes.NewReader(b)); !errors.Is(err, ErrTable) {
			t.Errorf("%s: decoded (%v)", name, err)
		}
	}
}

// FuzzDecode: whatever decodes encodes back to the same bytes.
func FuzzDecode(f *testing.F) {
	f.Add(encode(f, &Table{Tasks: []Task{{ID: 3, Extents: []Extent{{Vaddr: 0x1000, Size: PageSize, Path: "/x", Offset: 8192}}}}}))
	a := record.Sum(nil)
	f.Add(encode(f, &Table{Tasks: []Task{{ID: 3, Extents: []Extent{{Vaddr: 0x1000, Size: PageSize, Path: "/x", Verify: &a}}}, {ID: 4}}}))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(bytes.NewReader(b))
		if err != nil {
			return
		}
		if got := encode(t, m); !bytes.Equal(got, b) {
			t.Fatalf("%x decodes and encodes to %x", b, got)
		}
	})
}

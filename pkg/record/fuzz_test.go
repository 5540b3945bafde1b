package record

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

// vectorSeeds returns the wire forms and canonical segment bytes found in
// the conformance pack, for seeding the fuzzers.
func vectorSeeds(t testing.TB) (wires [][]byte, canon [][]byte) {
	files, _ := filepath.Glob("../../testdata/conformance/*.json")
	if len(files) == 0 {
		t.Fatal("no conformance vectors to seed from")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var class struct {
			Cases []struct {
				Wire  string `json:"wire"`
				Steps []struct {
					Segment Segment `json:"segment"`
				} `json:"steps"`
			} `json:"cases"`
		}
		if err := json.Unmarshal(b, &class); err != nil {
			t.Fatal(err)
		}
		for _, c := range class.Cases {
			if c.Wire != "" {
				wires = append(wires, []byte(c.Wire))
			}
			for _, st := range c.Steps {
				if b, err := st.Segment.Canonical(); err == nil {
					canon = append(canon, b)
				}
			}
		}
	}
	return wires, canon
}

func FuzzDecodeWire(f *testing.F) {
	wires, _ := vectorSeeds(f)
	for _, w := range wires {
		f.Add(w)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		r, err := DecodeWire(in)
		if err != nil {
			return
		}
		if out := r.EncodeWire(); !bytes.Equal(out, in) {
			t.Fatalf("decoded, but re-encodes differently:\n in %q\nout %q", in, out)
		}
		if err := r.Verify(); err != nil {
			t.Fatalf("decoded record does not verify: %v", err)
		}
	})
}

func FuzzDecodeSegment(f *testing.F) {
	_, canon := vectorSeeds(f)
	for _, c := range canon {
		f.Add(c)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		s, err := DecodeSegment(in)
		if err != nil {
			return
		}
		out, err := s.Canonical()
		if err != nil {
			t.Fatalf("decoded segment does not encode: %v", err)
		}
		if !bytes.Equal(out, in) {
			t.Fatalf("decoded, but re-encodes differently:\n in %x\nout %x", in, out)
		}
		js, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		var back Segment
		if err := json.Unmarshal(js, &back); err != nil {
			t.Fatalf("wire form of a decoded segment does not parse: %v", err)
		}
		if again, _ := back.Canonical(); !bytes.Equal(again, in) {
			t.Fatalf("JSON round trip changed the bytes: %x", again)
		}
	})
}

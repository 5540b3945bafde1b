package bundle

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"testing"
)

// headerVectors is testdata/conformance/bundle/header.json
// (docs/conformance.md, "bundle.json vectors").
type headerVectors struct {
	Format      string `json:"format"`
	Description string `json:"description"`
	Cases       []struct {
		Name   string  `json:"name"`
		JSON   string  `json:"bundle_json"`
		Expect string  `json:"expect"`
		Header *Header `json:"header,omitempty"`
	} `json:"cases"`
}

// Every bundle.json vector decodes to its stated outcome, and an accepted
// one to its stated fields.
func TestHeaderVectors(t *testing.T) {
	b, err := os.ReadFile("../../testdata/conformance/bundle/header.json")
	if err != nil {
		t.Fatal(err)
	}
	var v headerVectors
	d := json.NewDecoder(bytes.NewReader(b))
	d.DisallowUnknownFields()
	if err := d.Decode(&v); err != nil || v.Format != "bundle.json" || len(v.Cases) == 0 {
		t.Fatalf("vectors: %v (format %q, %d cases)", err, v.Format, len(v.Cases))
	}
	names := map[string]error{"Malformed": ErrMalformed, "Limit": ErrLimit}
	seen, exporter := map[string]bool{}, false
	for _, c := range v.Cases {
		if seen[c.Name] || (c.Expect == "ok") != (c.Header != nil) || (c.Expect != "ok" && names[c.Expect] == nil) {
			t.Fatalf("%s: a repeated name, an unknown outcome, or a header with a refusal", c.Name)
		}
		seen[c.Name] = true
		h, err := parseHeader([]byte(c.JSON), DefaultLimits)
		switch {
		case c.Expect == "ok" && err != nil:
			t.Errorf("%s: %v, want ok", c.Name, err)
		case c.Expect == "ok" && h != *c.Header:
			t.Errorf("%s: %+v, want %+v", c.Name, h, *c.Header)
		case c.Expect != "ok" && !errors.Is(err, names[c.Expect]):
			t.Errorf("%s: %v, want %s", c.Name, err, c.Expect)
		}
		// The exporter's form is what Export writes for that header.
		if c.Name == "exporter-form" {
			exporter = true
			if b, _ := json.MarshalIndent(c.Header, "", "  "); string(b) != c.JSON {
				t.Errorf("%s: Export writes\n%s", c.Name, b)
			}
		}
	}
	if !exporter {
		t.Error("no exporter-form case")
	}
}

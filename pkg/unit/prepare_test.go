package unit

import (
	"errors"
	"strings"
	"testing"
)

const testDigest = "sha256:" + "ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12ab12"

func pinTo(digest string) func(Spec) (string, error) {
	return func(Spec) (string, error) { return digest, nil }
}

// Prepare fills in the defaults, draws a fresh nonce each time and pins the
// image; the canonical bytes are those of what it returns.
func TestPrepare(t *testing.T) {
	p, err := Prepare(Spec{Image: "img"}, Grants{}, pinTo(testDigest))
	if err != nil {
		t.Fatal(err)
	}
	if p.Spec.Mode != ImageMode || p.Grants.Network != NoNetwork || p.Spec.ImageDigest != testDigest || len(p.Spec.Nonce) != NonceLen {
		t.Fatalf("prepared %+v", p)
	}
	if sb, _ := p.Spec.Canonical(); string(sb) != string(p.SpecBytes) {
		t.Fatal("spec bytes are not the prepared spec's")
	}
	if gb, _ := p.Grants.Canonical(); string(gb) != string(p.GrantsBytes) {
		t.Fatal("grant bytes are not the prepared grants'")
	}
	q, err := Prepare(Spec{Image: "img"}, Grants{}, pinTo(testDigest))
	if err != nil || q.Spec.Nonce == p.Spec.Nonce {
		t.Fatalf("a second run's nonce %q, the first's %q (%v)", q.Spec.Nonce, p.Spec.Nonce, err)
	}
}

// Each refusal is typed, and the pin's own error comes back as it is.
func TestPrepareRefuses(t *testing.T) {
	gone := errors.New("no such image")
	for name, c := range map[string]struct {
		spec   Spec
		grants Grants
		pin    func(Spec) (string, error)
		want   error
	}{
		"no image":         {spec: Spec{}, pin: pinTo(testDigest), want: ErrInvalid},
		"a chosen nonce":   {spec: Spec{Image: "img", Nonce: strings.Repeat("0", NonceLen)}, pin: pinTo(testDigest), want: ErrInvalid},
		"image not here":   {spec: Spec{Image: "img"}, pin: func(Spec) (string, error) { return "", gone }, want: gone},
		"a bad digest":     {spec: Spec{Image: "img"}, pin: pinTo("md5:x"), want: ErrInvalid},
		"a bad env":        {spec: Spec{Image: "img", Env: []string{"NOEQUALS"}}, pin: pinTo(testDigest), want: ErrInvalid},
		"a tiny memory":    {spec: Spec{Image: "img"}, grants: Grants{MemoryBytes: 1}, pin: pinTo(testDigest), want: ErrInvalid},
		"a relative mount": {spec: Spec{Image: "img"}, grants: Grants{ReadOnly: []Mount{{Source: "a", Target: "/b"}}}, pin: pinTo(testDigest), want: ErrInvalid},
	} {
		if _, err := Prepare(c.spec, c.grants, c.pin); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
}

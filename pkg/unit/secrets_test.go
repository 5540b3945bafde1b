package unit

import (
	"errors"
	"strings"
	"testing"
)

func TestSecretsBlock(t *testing.T) {
	g := Grants{Network: NoNetwork, Secrets: []string{"A"}}
	b, err := g.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	want := append([]byte(GrantsDomain), unhex(t, "00000000 0000000000000000 01 00000000 03 00000001 00000001 41")...)
	if string(b) != string(want) {
		t.Fatalf("bytes %x, want %x", b, want)
	}
	// No secret: no block, the bytes grant sets had before secrets.
	none, _ := (&Grants{Network: NoNetwork}).Canonical()
	if string(none) != string(want[:len(want)-10]) {
		t.Errorf("no secrets: %x", none)
	}
	// An empty block is not canonical.
	empty := append([]byte(GrantsDomain), unhex(t, "00000000 0000000000000000 01 00000000 03 00000000")...)
	if _, err := DecodeGrants(empty); !errors.Is(err, ErrMalformed) {
		t.Errorf("empty block: %v", err)
	}
	// An unknown tag.
	other := append([]byte(GrantsDomain), unhex(t, "00000000 0000000000000000 01 00000000 04 00000001 00000001 41")...)
	if _, err := DecodeGrants(other); !errors.Is(err, ErrMalformed) {
		t.Errorf("tag 04: %v", err)
	}
	// Secrets after limits and egress decode.
	full := Grants{Network: Egress, Limits: Limits{Pids: 1}, Egress: []Dest{{Name: "pypi.org", Proto: "tcp", Ports: "443"}}, Secrets: []string{"K"}}
	fb, err := full.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	if d, err := DecodeGrants(fb); err != nil || len(d.Secrets) != 1 || d.Secrets[0] != "K" || len(d.Egress) != 1 || d.Limits.Pids != 1 {
		t.Errorf("full: %+v %v", d, err)
	}
}

func TestSecretNamesRefused(t *testing.T) {
	for _, names := range [][]string{
		{""}, {"."}, {".."}, {"a/b"}, {"a b"}, {"ä"}, {"a\x00"}, {strings.Repeat("a", MaxSecretName+1)},
		{"b", "a"}, {"a", "a"},
	} {
		g := Grants{Network: NoNetwork, Secrets: names}
		if _, err := g.Canonical(); !errors.Is(err, ErrInvalid) {
			t.Errorf("%q: %v", names, err)
		}
		if b := g.Encode(); true {
			if _, err := DecodeGrants(b); !refused(err) {
				t.Errorf("%q decoded: %v", names, err)
			}
		}
	}
	many := make([]string, MaxSecrets+1)
	for i := range many {
		many[i] = string(rune('A'+i/26)) + string(rune('a'+i%26))
	}
	if _, err := (&Grants{Network: NoNetwork, Secrets: many}).Canonical(); !errors.Is(err, ErrInvalid) {
		t.Errorf("%d secrets: %v", len(many), err)
	}
	if err := checkSecrets(many[:MaxSecrets]); err != nil {
		t.Errorf("%d secrets: %v", MaxSecrets, err)
	}
	if got := SortSecrets([]string{"b", "a", "b"}); strings.Join(got, ",") != "a,b" {
		t.Errorf("SortSecrets: %q", got)
	}
	if err := CheckSecretName("OPENAI_API_KEY.v-1"); err != nil {
		t.Error(err)
	}
}

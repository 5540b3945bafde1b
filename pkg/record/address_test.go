package record

import (
	"crypto/rand"
	"errors"
	"testing"

	"lukechampine.com/blake3"
	"lukechampine.com/blake3/guts"
)

func TestAddressText(t *testing.T) {
	var a Address
	for i := range a {
		a[i] = byte(i)
	}
	const want = "b3:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"
	if got := a.String(); got != want {
		t.Fatalf("String() = %s, want %s", got, want)
	}
	back, err := ParseAddress(want)
	if err != nil || back != a {
		t.Fatalf("ParseAddress round trip: %v %v", back, err)
	}
}

func TestParseAddressStrict(t *testing.T) {
	good := fill(0xfb).String()
	for name, s := range map[string]string{
		"empty":         "",
		"no prefix":     good[3:],
		"wrong prefix":  "b2:" + good[3:],
		"upper prefix":  "B3:" + good[3:],
		"short":         good[:len(good)-1],
		"long":          good + "A",
		"padded":        good[:len(good)-1] + "=",
		"std alphabet":  good[:10] + "+" + good[11:],
		"slash":         good[:10] + "/" + good[11:],
		"trailing bits": good[:len(good)-1] + "9", // last char carries 2 unused bits
		"space":         good[:10] + " " + good[11:],
	} {
		if _, err := ParseAddress(s); !errors.Is(err, ErrAddress) {
			t.Errorf("%s: ParseAddress(%q) err = %v, want ErrAddress", name, s, err)
		}
	}
}

func TestSum(t *testing.T) {
	// BLAKE3 of inputs of byte i = i%251, from the BLAKE3 reference test
	// vectors: the empty one, and lengths that take the vectorised path.
	for n, want := range map[int]string{
		0:     "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262",
		1025:  "d00278ae47eb27b34faecf67b4fe263f82d5412916c1ffd97c8cb7fb814b8444",
		8193:  "bab6c09cb8ce8cf459261398d2e7aef35700bf488116ceb94a36d0f5f1b7bc3b",
		16384: "f875d6646de28985646f34ee13be9a576fd515f76b5b0a26bb324735041ddde4",
	} {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(i % 251)
		}
		if got := Sum(b); hexOf(got[:]) != want {
			t.Errorf("Sum of %d bytes = %x, want %s", n, got, want)
		}
	}
}

// TestSumEveryLength checks the vectorised path against blake3.Sum256
// at every length around it, on bytes that are not a pattern.
func TestSumEveryLength(t *testing.T) {
	b := make([]byte, simdBytes+guts.ChunkSize+1)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	for n := guts.ChunkSize - 1; n <= len(b); n++ {
		if got, want := Sum(b[:n]), Address(blake3.Sum256(b[:n])); got != want {
			t.Fatalf("Sum of %d bytes = %s, blake3.Sum256 %s", n, got, want)
		}
	}
}

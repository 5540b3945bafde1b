package record

import (
	"errors"
	"testing"
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
	// BLAKE3 of the empty input, from the BLAKE3 reference test vectors.
	const empty = "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
	if got := Sum(nil); hexOf(got[:]) != empty {
		t.Fatalf("Sum(nil) = %x", got)
	}
}

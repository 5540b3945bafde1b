package attest

import (
	"bytes"
	"crypto/ed25519"
	"encoding/hex"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/record"
)

func fill(b byte) record.Address {
	var a record.Address
	for i := range a {
		a[i] = b
	}
	return a
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	var out []byte
	for _, f := range strings.Fields(s) {
		if i := strings.Index(f, "*"); i > 0 {
			b, _ := hex.DecodeString(f[:i])
			out = append(out, bytes.Repeat(b, 32)...)
			continue
		}
		b, err := hex.DecodeString(f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b...)
	}
	return out
}

func body() *Body {
	return &Body{
		Genesis: fill(1), Interval: 2, PrevHead: fill(3), HostKey: fill(4),
		StartNS: 5, EndNS: 6, Receipt: fill(7), Journal: fill(8),
		Outcome: Outcome{Kind: Exited, Code: -1},
	}
}

func TestBodyPinned(t *testing.T) {
	got, err := body().Canonical()
	if err != nil {
		t.Fatal(err)
	}
	want := append([]byte(BodyDomain), mustHex(t, `01*32 0000000000000002 03*32 04*32
		0000000000000005 0000000000000006 07*32 08*32 03 ffffffff 00`)...)
	if !bytes.Equal(got, want) {
		t.Fatalf("got  %x\nwant %x", got, want)
	}
	b := body()
	b.Outcome = Outcome{Kind: Parked, Suspends: fill(10)}
	prev := fill(9)
	b.AuditPrev = &prev
	got, _ = b.Canonical()
	if !bytes.HasSuffix(got, mustHex(t, "08*32 02 0a*32 01 09*32")) {
		t.Fatalf("parked with audit_prev: %x", got)
	}
	back, err := DecodeBody(got)
	if err != nil || back.AuditPrev == nil || *back.AuditPrev != prev || back.Outcome != b.Outcome {
		t.Fatalf("decode: %+v %v", back, err)
	}
}

func TestBodyRefused(t *testing.T) {
	b := body()
	b.Outcome = Outcome{Kind: Parked, Code: 3, Suspends: fill(1)}
	if _, err := b.Canonical(); !errors.Is(err, ErrMalformed) {
		t.Fatal(err)
	}
	b.Outcome = Outcome{Kind: Parked} // a park that names no Suspended segment
	if _, err := b.Canonical(); !errors.Is(err, ErrMalformed) {
		t.Fatal(err)
	}
	b.Outcome = Outcome{Kind: Killed, Suspends: fill(1)}
	if _, err := b.Canonical(); !errors.Is(err, ErrMalformed) {
		t.Fatal(err)
	}
	b = body()
	b.EndNS = 1
	if _, err := b.Canonical(); !errors.Is(err, ErrMalformed) {
		t.Fatal(err)
	}
	good, _ := body().Canonical()
	for _, bad := range [][]byte{good[:len(good)-1], append(append([]byte{}, good...), 0), nil} {
		if _, err := DecodeBody(bad); !errors.Is(err, ErrMalformed) {
			t.Fatalf("decoded %x", bad)
		}
	}
}

func TestSignAndOpen(t *testing.T) {
	_, key, _ := ed25519.GenerateKey(nil)
	s, err := Sign(body(), key)
	if err != nil {
		t.Fatal(err)
	}
	env := s.Encode()
	b, err := Open(env, nil)
	if err != nil {
		t.Fatal(err)
	}
	if b.HostKey != KeyID(key.Public().(ed25519.PublicKey)) || b.Interval != 2 {
		t.Fatalf("body %+v", b)
	}
	// One flipped bit anywhere is refused.
	for _, i := range []int{len(EnvelopeDomain) + 10, len(env) - 70, len(env) - 1} {
		bad := append([]byte{}, env...)
		bad[i] ^= 1
		if _, err := Open(bad, nil); err == nil {
			t.Fatalf("flip at %d accepted", i)
		}
	}
	_, other, _ := ed25519.GenerateKey(nil)
	trust := func(p ed25519.PublicKey) bool { return p.Equal(other.Public()) }
	if _, err := Open(env, trust); !errors.Is(err, ErrSignature) {
		t.Fatalf("untrusted key accepted: %v", err)
	}
}

func TestReceiptRoundTrip(t *testing.T) {
	r := &Receipt{UJ: 42, Provenance: record.Estimated, Method: "cpu-time-coefficient", CPUNS: 1e9, WindowNS: 2e9,
		Inputs: map[string]string{"coefficient_uj_per_core_s": "10000000", "b": "x"}}
	b, err := r.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	back, err := DecodeReceipt(b)
	if err != nil || back.UJ != 42 || back.Inputs["b"] != "x" {
		t.Fatalf("%+v %v", back, err)
	}
	if _, err := DecodeReceipt(b[:len(b)-1]); err == nil {
		t.Fatal("truncated receipt accepted")
	}
	r.Provenance = 0
	if _, err := r.Canonical(); !errors.Is(err, ErrMalformed) {
		t.Fatal(err)
	}
}

func TestJournal(t *testing.T) {
	var j Journal
	j.Add(Lifecycle, 1, []byte("started"))
	j.Add(Stdout, 2, []byte("hello\n"))
	got := j.Encode()
	want := append([]byte(JournalDomain), mustHex(t, "00000002 03 0000000000000001 00000007 73746172746564 01 0000000000000002 00000006 68656c6c6f0a")...)
	if !bytes.Equal(got, want) {
		t.Fatalf("got %x", got)
	}
	if j.Root() != record.Sum(want) {
		t.Fatal("root is not the object's address")
	}
	back, err := DecodeJournal(got)
	if err != nil || len(back.Entries) != 2 || string(back.Entries[1].Data) != "hello\n" {
		t.Fatalf("%+v %v", back, err)
	}
	if _, err := DecodeJournal(got[:len(got)-2]); err == nil {
		t.Fatal("truncated journal accepted")
	}
}

func TestHostKey(t *testing.T) {
	p := filepath.Join(t.TempDir(), "host.key")
	k1, err := LoadOrCreateKey(p)
	if err != nil {
		t.Fatal(err)
	}
	k2, err := LoadOrCreateKey(p)
	if err != nil || !k1.Equal(k2) {
		t.Fatal("key not kept")
	}
	if st, _ := os.Stat(p); st.Mode().Perm() != 0o600 {
		t.Fatalf("mode %v", st.Mode())
	}
	os.Chmod(p, 0o644)
	if _, err := LoadOrCreateKey(p); err == nil {
		t.Fatal("world-readable key accepted")
	}
	os.Chmod(p, 0o600)
	os.WriteFile(p, []byte("short"), 0o600)
	if _, err := LoadOrCreateKey(p); err == nil {
		t.Fatal("short key accepted")
	}
	// A dangling link is neither followed nor replaced, and is an error,
	// not a loop of creating and finding the name taken.
	dangling := filepath.Join(t.TempDir(), "host.key")
	if err := os.Symlink(dangling+".gone", dangling); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadOrCreateKey(dangling); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("dangling link: %v", err)
	}
	if _, err := os.Lstat(dangling + ".gone"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatal("a key created through a dangling link")
	}
}

// Of hosts creating one key at once, all get the same key.
func TestHostKeyRace(t *testing.T) {
	p := filepath.Join(t.TempDir(), "host.key")
	keys := make([]ed25519.PrivateKey, 8)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			k, err := LoadOrCreateKey(p)
			if err != nil {
				t.Error(err)
			}
			keys[i] = k
		})
	}
	wg.Wait()
	for _, k := range keys[1:] {
		if !k.Equal(keys[0]) {
			t.Fatal("two keys created")
		}
	}
}

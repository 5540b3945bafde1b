package attest

import (
	"bytes"
	"crypto/ed25519"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// fuzzKey signs the bodies FuzzAttestation decodes.
var fuzzKey = ed25519.NewKeyFromSeed(bytes.Repeat([]byte{9}, 32))

// FuzzAttestation feeds the same bytes to every decoder of the package:
// the body, the envelope (parsed, then opened), the receipt and the
// journal, and a resolution entry's data. None may panic; whatever one accepts must re-encode to its
// input; an envelope that verifies must verify again when rebuilt from
// what it decodes to; and a body that decodes, signed, must open to
// itself. Seeded from the worked example and from signed attestations of
// every outcome, with and without audit_prev.
func FuzzAttestation(f *testing.F) {
	ex := loadExample(f)
	for _, b := range [][]byte{ex.Expect.Envelope, ex.Expect.Body, ex.Expect.Receipt, ex.Expect.Journal} {
		f.Add(b)
	}
	prev := fill(0x0b)
	for _, out := range []Outcome{{Kind: Running}, {Kind: Parked, Suspends: fill(0x0a)}, {Kind: Exited, Code: -1}, {Kind: Exited}, {Kind: Killed}} {
		for _, audit := range []*record.Address{nil, &prev} {
			b := body()
			b.Outcome, b.AuditPrev = out, audit
			s, err := Sign(b, fuzzKey)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(s.Body)
			f.Add(s.Encode())
			// Near misses, which random mutation seldom makes: the outcome
			// (offset 208) and the audit_prev marker at neighbouring and
			// unknown values, a body length one off, a byte short and a
			// byte over.
			marker := len(s.Body) - 1
			if audit != nil {
				marker -= 32
			}
			for _, at := range []int{208, marker} {
				for _, v := range []byte{0, 1, 2, 3, 4, 5, 0xff} {
					f.Add(with(s.Body, at, v))
				}
			}
			env := s.Encode()
			n := len(EnvelopeDomain) + 3
			f.Add(with(env, n, env[n]-1))
			f.Add(with(env, n, env[n]+1))
			for _, p := range [][]byte{s.Body, env} {
				f.Add(p[:len(p)-1])
				f.Add(append(append([]byte{}, p...), 0))
			}
		}
	}
	var j Journal
	for k := Stdout; k <= Result; k++ {
		j.Add(k, -int64(k), bytes.Repeat([]byte{byte(k)}, int(k)))
	}
	f.Add(j.Encode())
	f.Add((&Journal{}).Encode())
	if d, err := resolutionExample.Encode(); err == nil {
		f.Add(d)
		var jr Journal
		jr.Add(ResolutionKind, 1, d)
		f.Add(jr.Encode())
	}
	if d, err := closedExample.Encode(); err == nil {
		f.Add(d)
		var jc Journal
		jc.Add(ClosedKind, 1, d)
		f.Add(jc.Encode())
	}
	if rc, err := (&Receipt{Provenance: record.Measured, Method: "rapl-share"}).Canonical(); err == nil {
		f.Add(rc)
	}

	f.Fuzz(func(t *testing.T, in []byte) {
		if b, err := DecodeBody(in); err == nil {
			if out, err := b.Canonical(); err != nil || !bytes.Equal(out, in) {
				t.Fatalf("body decoded, but re-encodes differently (%v):\n in %x\nout %x", err, in, out)
			}
			s, err := Sign(b, fuzzKey)
			if err != nil {
				t.Fatalf("a decoded body does not sign: %v", err)
			}
			back, err := Open(s.Encode(), nil)
			if err != nil {
				t.Fatalf("a decoded body, signed, does not open: %v", err)
			}
			if out, _ := back.Canonical(); !bytes.Equal(out, s.Body) {
				t.Fatalf("a decoded body, signed and opened, is another:\n in %x\nout %x", s.Body, out)
			}
		}

		s, derr := DecodeSigned(in)
		opened, oerr := Open(in, nil)
		if derr != nil {
			if oerr == nil {
				t.Fatalf("Open accepts an envelope DecodeSigned refuses: %v", derr)
			}
		} else if out := s.Encode(); !bytes.Equal(out, in) {
			t.Fatalf("envelope decoded, but re-encodes differently:\n in %x\nout %x", in, out)
		}
		if oerr == nil {
			c, err := opened.Canonical()
			if err != nil || !bytes.Equal(c, s.Body) {
				t.Fatalf("opened body re-encodes to %x, the envelope carries %x (%v)", c, s.Body, err)
			}
			again := (&Signed{Body: c, PublicKey: s.PublicKey, Signature: s.Signature}).Encode()
			if _, err := Open(again, nil); err != nil || !bytes.Equal(again, in) {
				t.Fatalf("a verifying envelope, rebuilt, does not verify the same (%v):\n in %x\nout %x", err, in, again)
			}
		}

		if r, err := DecodeReceipt(in); err == nil {
			if out, err := r.Canonical(); err != nil || !bytes.Equal(out, in) {
				t.Fatalf("receipt decoded, but re-encodes differently (%v):\n in %x\nout %x", err, in, out)
			}
		}
		if r, err := DecodeResolution(in); err == nil {
			if out, err := r.Encode(); err != nil || !bytes.Equal(out, in) {
				t.Fatalf("resolution decoded, but re-encodes differently (%v):\n in %x\nout %x", err, in, out)
			}
		}
		if c, err := DecodeClosed(in); err == nil {
			if out, err := c.Encode(); err != nil || !bytes.Equal(out, in) {
				t.Fatalf("closed entry decoded, but re-encodes differently (%v):\n in %x\nout %x", err, in, out)
			}
		}
		if j, err := DecodeJournal(in); err == nil {
			if out := j.Encode(); !bytes.Equal(out, in) {
				t.Fatalf("journal decoded, but re-encodes differently:\n in %x\nout %x", in, out)
			}
		}
	})
}

// with returns a copy of p with p[i] = v.
func with(p []byte, i int, v byte) []byte {
	q := append([]byte{}, p...)
	q[i] = v
	return q
}

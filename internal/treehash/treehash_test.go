package treehash

import (
	"bytes"
	"context"
	"encoding/hex"
	"io"
	"math/rand/v2"
	"os"
	"testing"

	"lukechampine.com/blake3"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// serialSum hashes b with a Serial, in writes of the sizes next
// gives.
func serialSum(b []byte, next func(rest int) int) record.Address {
	var h Serial
	for len(b) > 0 {
		k := min(len(b), max(1, next(len(b))))
		h.Write(b[:k])
		b = b[k:]
	}
	return h.Sum()
}

// The official BLAKE3 test vectors' input (byte i is i mod 251), at the
// lengths around each boundary the tree has: a chunk, a group, a group
// and a chunk, and powers of two beyond.
func TestSerialHasherVectors(t *testing.T) {
	input := make([]byte, 1<<20+Group+3)
	for i := range input {
		input[i] = byte(i % 251)
	}
	// From BLAKE3's test_vectors.json, unkeyed hash, first 32 bytes.
	for n, want := range map[int]string{
		0:    "af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262",
		1:    "2d3adedff11b61f14c886e35afa036736dcd87a74d27b5c1510225d0f592e213",
		1023: "10108970eeda3eb932baac1428c7a2163b0e924c9a9e25b35bba72b28f70bd11",
		1024: "42214739f095a406f3fc83deb889744ac00df831c10daa55189b5d121c855af7",
		1025: "d00278ae47eb27b34faecf67b4fe263f82d5412916c1ffd97c8cb7fb814b8444",
		2048: "e776b6028c7cd22a4d0ba182a8bf62205d2ef576467e838ed6f2529b85fba24a",
		2049: "5f4d72f40d7a5f82b15ca2b2e44b1de3c2ef86c426c95c1af0b6879522563030",
		8192: "aae792484c8efe4f19e2ca7d371d8c467ffb10748d8a5a1ae579948f718a2a63",
		8193: "bab6c09cb8ce8cf459261398d2e7aef35700bf488116ceb94a36d0f5f1b7bc3b",
	} {
		if got := serialSum(input[:n], func(int) int { return n }); hex.EncodeToString(got[:]) != want {
			t.Errorf("%d bytes: %x, want %s", n, got, want)
		}
	}
	// Past the vectors' lengths, against record.Sum (blake3.Sum256).
	for _, n := range []int{Group - 1, Group, Group + 1, Group + 1024, 2 * Group, 2*Group + 1, 31 * Group, 1 << 20, len(input)} {
		if got, want := serialSum(input[:n], func(int) int { return n }), record.Sum(input[:n]); got != want {
			t.Errorf("%d bytes: %s, want %s", n, got, want)
		}
	}
}

// In writes of any sizes, the hash is BLAKE3's.
func TestSerialHasherWrites(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	data := content(7, 5<<20)
	for range 100 {
		n := r.IntN(len(data) + 1)
		sizes := []func(int) int{
			func(int) int { return r.IntN(70000) },
			func(int) int { return Group * (1 + r.IntN(3)) },
			func(int) int { return 1 + r.IntN(3) },
			func(rest int) int { return rest - 1 },
		}
		if got, want := serialSum(data[:n], sizes[r.IntN(len(sizes))]), record.Sum(data[:n]); got != want {
			t.Fatalf("%d bytes: %s, want %s", n, got, want)
		}
	}
}

func FuzzSerialHasher(f *testing.F) {
	f.Add([]byte{}, uint16(1))
	f.Add(content(1, Group+1), uint16(Group))
	f.Add(content(2, 3*Group+5), uint16(1000))
	f.Fuzz(func(t *testing.T, b []byte, step uint16) {
		if got, want := serialSum(b, func(int) int { return int(step) }), record.Sum(b); got != want {
			t.Fatalf("%d bytes in writes of %d: %s, want %s", len(b), step, got, want)
		}
	})
}

// The hasher beside blake3.Hasher, in 1 MiB writes (the park follower's); with
// -cpu 1,2 it shows that blake3.Hasher takes the second core for its
// speed, and the serial one does not need it.
func BenchmarkSerialHasher(b *testing.B) {
	buf := content(3, 1<<20)
	b.Run("serial", func(b *testing.B) {
		var h Serial
		b.SetBytes(int64(len(buf)))
		for b.Loop() {
			h.Write(buf)
		}
	})
	b.Run("blake3", func(b *testing.B) {
		h := blake3.New(32, nil)
		b.SetBytes(int64(len(buf)))
		for b.Loop() {
			h.Write(buf)
		}
	})
}

// TestHashHalves holds the two-subtree hash equal to one BLAKE3 over the
// same bytes, at sizes around every boundary that shapes the tree: empty,
// one chunk, one byte past, powers of two of chunks and groups, and odd
// sizes between.
func TestHashHalves(t *testing.T) {
	data := make([]byte, 3<<20+12345)
	for i := range data {
		data[i] = byte(i*31 + i>>9)
	}
	sizes := []int{0, 1, 1023, 1024, 1025, 2048, 2049, 4096, 8191, 8192, 8193,
		16 << 10, 16<<10 + 1, 64<<10 - 1, 1 << 20, 1<<20 + 1, 1<<20 + 1024, 2<<20 - 7, 3 << 20, len(data)}
	for _, n := range sizes {
		got, err := Halves(context.Background(), bytes.NewReader(data[:n]), int64(n))
		if err != nil {
			t.Fatal(err)
		}
		if want := record.Sum(data[:n]); got != want {
			t.Errorf("%d bytes: halves give %s, BLAKE3 %s (split at %d)", n, got, want, splitAt(int64(n)))
		}
	}
}

// BenchmarkHashFile hashes a 256 MiB file as a resume's first precondition
// does (store.Rehash): the two subtrees on two goroutines, against blake3.Hasher.
func BenchmarkHashFile(b *testing.B) {
	p := b.TempDir() + "/big"
	data := make([]byte, 256<<20)
	for i := range data {
		data[i] = byte(i*31 + i>>9)
	}
	if err := os.WriteFile(p, data, 0o600); err != nil {
		b.Fatal(err)
	}
	b.Run("halves", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			f, err := os.Open(p)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := Halves(context.Background(), f, int64(len(data))); err != nil {
				b.Fatal(err)
			}
			f.Close()
		}
	})
	b.Run("blake3.Hasher", func(b *testing.B) {
		b.SetBytes(int64(len(data)))
		for b.Loop() {
			f, err := os.Open(p)
			if err != nil {
				b.Fatal(err)
			}
			h := blake3.New(32, nil)
			// Hide f's WriteTo, which would copy through 32 KiB.
			if _, err := io.CopyBuffer(h, struct{ io.Reader }{f}, make([]byte, 1<<20)); err != nil {
				b.Fatal(err)
			}
			f.Close()
			h.Sum(nil)
		}
	})
}

// content returns n pseudo-random bytes from seed.
func content(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

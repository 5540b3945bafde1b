package record

import (
	"encoding/binary"
	"fmt"
	"testing"

	"lukechampine.com/blake3"
)

const benchSegments = 1_000_000

// benchSegs is a realistic record: accounted intervals dispatching and
// resolving calls, with transcript parks between them.
func benchSegs() []Segment {
	segs := make([]Segment, 0, benchSegments)
	var prev string
	for i := 0; len(segs) < benchSegments; i++ {
		var att, tr Address
		binary.BigEndian.PutUint64(att[:], uint64(i)|1<<62)
		binary.BigEndian.PutUint64(tr[:], uint64(i)|1<<63)
		id := fmt.Sprintf("call-%d", i)
		a := &CallAccount{Dispatched: []string{id}}
		if prev != "" {
			a.Resolved = []string{prev}
		}
		prev = id
		snap := TranscriptSnapshot(tr)
		segs = append(segs, Execution(att, a), Suspension(snap, tr), Resumption(snap, 10, Estimated))
	}
	return segs[:benchSegments]
}

func benchRecord(b *testing.B) *Record {
	r := New(fill(1), fill(2))
	for _, s := range benchSegs() {
		if _, err := r.Append(s); err != nil {
			b.Fatal(err)
		}
	}
	return r
}

func BenchmarkVerify(b *testing.B) {
	r := benchRecord(b)
	b.ResetTimer()
	for b.Loop() {
		if err := r.Verify(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(benchSegments)*float64(b.N)/b.Elapsed().Seconds(), "segments/s")
}

func BenchmarkWaitProof(b *testing.B) {
	r := benchRecord(b)
	b.ResetTimer()
	for b.Loop() {
		if v := r.WaitProof(); v.Kind != NonBlocking {
			b.Fatal(v)
		}
	}
	b.ReportMetric(float64(benchSegments)*float64(b.N)/b.Elapsed().Seconds(), "segments/s")
}

func BenchmarkAppend(b *testing.B) {
	segs := benchSegs()
	b.ResetTimer()
	for b.Loop() {
		r := New(fill(1), fill(2))
		for i := range segs {
			if _, err := r.Append(segs[i]); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(benchSegments)*float64(b.N)/b.Elapsed().Seconds(), "segments/s")
}

// BenchmarkSum is the address of a store chunk (16 KiB) by Sum and by
// blake3.Sum256, side by side.
func BenchmarkSum(b *testing.B) {
	chunk := make([]byte, simdBytes)
	for i := range chunk {
		chunk[i] = byte(i * 7)
	}
	for name, sum := range map[string]func([]byte) Address{
		"Sum":           Sum,
		"blake3.Sum256": func(p []byte) Address { return Address(blake3.Sum256(p)) },
	} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(chunk)))
			b.ReportAllocs()
			for b.Loop() {
				sum(chunk)
			}
		})
	}
}

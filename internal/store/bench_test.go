package store

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Durable appends to one run, one writer: every append is its own commit,
// fsynced before Append returns.
func BenchmarkAppendOneRun(b *testing.B) {
	s := mustStore(b)
	h := mustCreate(b, s, "r")
	att := put(b, s, "att")
	seg := record.Execution(att, &record.CallAccount{})
	for b.Loop() {
		var err error
		if h, err = s.Append("r", h, seg); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
}

// Durable appends across 64 runs, one writer per run: group commit shares
// each fsync among the writers that arrived during the last one.
func BenchmarkAppend64Runs(b *testing.B) {
	s := mustStore(b)
	att := put(b, s, "att")
	seg := record.Execution(att, &record.CallAccount{})
	const runs = 64
	heads := make([]record.Address, runs)
	for i := range heads {
		heads[i] = mustCreate(b, s, fmt.Sprintf("r%d", i))
	}
	per := b.N/runs + 1
	b.ResetTimer()
	var wg sync.WaitGroup
	for i := range runs {
		id := fmt.Sprintf("r%d", i)
		wg.Go(func() {
			h := heads[i]
			for range per {
				var err error
				if h, err = s.Append(id, h, seg); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(per*runs)/b.Elapsed().Seconds(), "appends/s")
}

// Ingest of a 1 GiB CRIU-like tree: two 496 MiB page images and 4,000
// 8 KiB image files. Writing the tree is not timed. In
// BenchmarkIngest1GiB the tree is already on disk when the ingest starts
// (its cost is hashing, renaming and the two syncfs calls);
// BenchmarkIngest1GiBDirty ingests a tree just written, as after a real
// checkpoint, so the ingest also waits for its writeback.
func BenchmarkIngest1GiB(b *testing.B) { benchIngest(b, true) }

func BenchmarkIngest1GiBDirty(b *testing.B) { benchIngest(b, false) }

func benchIngest(b *testing.B, written bool) {
	s := mustStore(b)
	const (
		large     = 2
		largeSize = 496 << 20
		small     = 4000
		smallSize = 8 << 10
	)
	total := int64(large*largeSize + small*smallSize)
	buf := make([]byte, largeSize)
	for i := range buf {
		buf[i] = byte(i * 31)
	}
	iter := 0
	for b.Loop() {
		b.StopTimer()
		iter++
		stage, _ := s.StagingDir("bench")
		for f := range large {
			copy(buf, fmt.Sprintf("%08d%08d", f, iter)) // new bytes every time
			os.WriteFile(filepath.Join(stage, fmt.Sprintf("pages-%d.img", f)), buf, 0o600)
		}
		for f := range small {
			copy(buf, fmt.Sprintf("%08d%08d", f, iter))
			os.WriteFile(filepath.Join(stage, fmt.Sprintf("core-%d.img", f)), buf[:smallSize], 0o600)
		}
		if written {
			syncFS(stage)
		}
		b.StartTimer()
		if _, st, err := s.Ingest(b.Context(), stage); err != nil || st.New != large+small {
			b.Fatalf("%+v %v", st, err)
		}
	}
	b.ReportMetric(float64(total)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}

// BenchmarkListing is a served resume's reading of a 512 MiB memory
// image's listing: 32,768 chunk entries (2.4 MB). Decode is the listing's
// decode and check alone; Rehash its rehash and decode from the store
// (RehashListing), as a resume's first step; Listing its verified read
// and decode (Listing).
func BenchmarkListing(b *testing.B) {
	st := mustStore(b)
	es := make([]Entry, 32768)
	for i := range es {
		es[i] = Entry{Name: fmt.Sprintf("pages-1.img%s/%08x", ChunkSuffix, i), Mode: 0o600, Size: 16384,
			Address: record.Sum(fmt.Appendf(nil, "chunk %d", i))}
	}
	enc, err := EncodeListing(es)
	if err != nil {
		b.Fatal(err)
	}
	a, err := st.PutBytes(enc)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("Decode", func(b *testing.B) {
		b.SetBytes(int64(len(enc)))
		for b.Loop() {
			if got, err := DecodeListing(enc); err != nil || len(got) != len(es) {
				b.Fatal(len(got), err)
			}
		}
	})
	b.Run("Rehash", func(b *testing.B) {
		b.SetBytes(int64(len(enc)))
		for b.Loop() {
			if got, at, err := st.RehashListing(b.Context(), a); err != nil || at != a || len(got) != len(es) {
				b.Fatal(len(got), at, err)
			}
		}
	})
	b.Run("Listing", func(b *testing.B) {
		b.SetBytes(int64(len(enc)))
		for b.Loop() {
			if got, err := st.Listing(a); err != nil || len(got) != len(es) {
				b.Fatal(len(got), err)
			}
		}
	})
}

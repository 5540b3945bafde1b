package store

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/runrecordd/runrecordd/pkg/record"
)

// Durable appends to one run: each append is its own fsynced commit.
func BenchmarkAppendOneRun(b *testing.B) {
	s := mustStore(b)
	h := mustCreate(b, s, "r")
	att := put(b, s, "att")
	seg := record.Execution(att, &record.CallAccount{})
	b.ResetTimer()
	for b.Loop() {
		var err error
		if h, err = s.Append("r", h, seg); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "appends/s")
}

// Durable appends across 64 runs, one writer each: group commit.
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
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := heads[i]
			for range per {
				var err error
				if h, err = s.Append(fmt.Sprintf("r%d", i), h, seg); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(per*runs)/b.Elapsed().Seconds(), "appends/s")
}

// Ingest of a 1 GiB CRIU-like tree: two large page files and many small
// image files. Only the ingest is timed; writing the tree is not. The tree
// is written back before timing, so this is the ingest's own cost (hash,
// rename, one syncfs); BenchmarkIngest1GiBDirty includes the writeback of
// a tree just written, as after a real checkpoint.
func BenchmarkIngest1GiB(b *testing.B) { benchIngest(b, true) }

// BenchmarkIngest1GiBDirty: the same, with the tree's pages still dirty.
func BenchmarkIngest1GiBDirty(b *testing.B) { benchIngest(b, false) }

func benchIngest(b *testing.B, clean bool) {
	s := mustStore(b)
	const large = 2
	const largeSize = 496 << 20
	const small = 4000
	const smallSize = 8 << 10
	total := int64(large*largeSize + small*smallSize)
	buf := make([]byte, largeSize)
	for b.Loop() {
		b.StopTimer()
		stage, _ := s.StagingDir("bench")
		for i := range large {
			for j := range buf {
				buf[j] = byte(j*31 + i*7 + b.N)
			}
			os.WriteFile(filepath.Join(stage, fmt.Sprintf("pages-%d.img", i)), buf, 0o600)
		}
		for i := range small {
			copy(buf[:16], fmt.Sprintf("%08d%08d", i, b.N))
			os.WriteFile(filepath.Join(stage, fmt.Sprintf("core-%d.img", i)), buf[:smallSize], 0o600)
		}
		if clean {
			syncTree(stage)
		}
		b.StartTimer()
		if _, _, err := s.Ingest(stage); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(total)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}

func syncTree(dir string) {
	filepath.Walk(dir, func(p string, info os.FileInfo, err error) error {
		if err == nil && info.Mode().IsRegular() {
			if f, err := os.Open(p); err == nil {
				f.Sync()
				f.Close()
			}
		}
		return nil
	})
}

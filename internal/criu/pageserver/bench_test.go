package pageserver

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/pkg/record"
	"golang.org/x/sys/unix"
)

// BenchmarkLoadChunksCold reads 1,024 store-sized chunks (16 KiB, under
// TMPDIR: put it on a disk) that the page cache does not hold: each a
// file, one by one with loadChunk and in batches of aioBatch with
// loadChunks; and in one slab, as a first chunked park stores them, in
// batches; side by side. Reported per chunk: the time, and the processor
// time (user+system) of the reads.
func BenchmarkLoadChunksCold(b *testing.B) {
	dir := b.TempDir()
	es := make([]*Extent, 1024)
	for i := range es {
		c := pages(bufSize/PageSize, byte(i))
		p := filepath.Join(dir, fmt.Sprint(i))
		if err := os.WriteFile(p, c, 0o600); err != nil {
			b.Fatal(err)
		}
		a := record.Sum(c)
		es[i] = &Extent{Vaddr: uint64(i) * bufSize, Size: bufSize, Path: p, Verify: &a}
	}
	slab := filepath.Join(dir, "slab")
	var whole []byte
	inSlab := make([]*Extent, len(es))
	for i, e := range es {
		c := pages(bufSize/PageSize, byte(i))
		inSlab[i] = &Extent{Vaddr: e.Vaddr, Size: e.Size, Path: slab, Offset: uint64(len(whole)), Verify: e.Verify}
		whole = append(whole, c...)
	}
	if err := os.WriteFile(slab, whole, 0o600); err != nil {
		b.Fatal(err)
	}
	batched := func(es []*Extent) func(*aio, *dirs) {
		return func(r *aio, d *dirs) {
			for i := 0; i < len(es); i += aioBatch {
				slots := make([]*slot, 0, aioBatch)
				for _, e := range es[i:min(i+aioBatch, len(es))] {
					slots = append(slots, &slot{e: e, done: make(chan struct{})})
				}
				loadChunks(slots, d, r)
				for _, sl := range slots {
					if sl.err != nil {
						b.Fatal(sl.err)
					}
					putBuf(sl.b)
				}
			}
		}
	}
	load := map[string]func(*aio, *dirs){
		"one-by-one": func(_ *aio, d *dirs) {
			for _, e := range es {
				c, err := loadChunk(e, d)
				if err != nil {
					b.Fatal(err)
				}
				putBuf(c)
			}
		},
		"batched":      batched(es),
		"batched-slab": batched(inSlab),
	}
	for _, name := range []string{"one-by-one", "batched", "batched-slab"} {
		b.Run(name, func(b *testing.B) {
			r, err := newAIO()
			if err != nil {
				b.Fatal(err)
			}
			defer r.close()
			d := &dirs{}
			defer d.close()
			var wall, cpu time.Duration
			for b.Loop() {
				b.StopTimer()
				for _, e := range es {
					uncache(b, e.Path)
				}
				uncache(b, slab)
				c0 := processorTime(b)
				t0 := time.Now()
				b.StartTimer()
				load[name](r, d)
				wall += time.Since(t0)
				cpu += processorTime(b) - c0
			}
			b.ReportMetric(float64(wall.Microseconds())/float64(b.N*len(es)), "µs/chunk")
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*len(es)), "cpu-µs/chunk")
		})
	}
}

// processorTime is this process's user and system time so far.
func processorTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

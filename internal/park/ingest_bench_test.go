package park

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/executor"
)

// BenchmarkFirstChunkedIngest is the part of a first chunked park of 512
// MiB after its dump returns (Result.Ingest: the follower's tail, the
// chunks not hashed early, both ingests and their syncs), from a producer
// that writes as CRIU does: the pages in 1 MiB appends at about 1 GB/s,
// and the pagemap, one entry per 1 MiB of one run, through a buffer of
// one page, so that its entries reach the file hundreds of MiB after
// their pages. It reports the median ingest.
func BenchmarkFirstChunkedIngest(b *testing.B) {
	const size = 512 << 20
	pages := content(61, size)
	var ingest []time.Duration
	for b.Loop() {
		st := mustStore(b)
		st.SetChunkedImages(true)
		p := &pacedProducer{pages: pages, rootfs: content(62, 4096), perMiB: time.Millisecond}
		res, err := Image(b.Context(), st, p, ImageOptions{})
		if err != nil {
			b.Fatal(err)
		}
		ingest = append(ingest, res.Ingest)
	}
	slices.Sort(ingest)
	b.ReportMetric(float64(ingest[len(ingest)/2].Milliseconds()), "ingest-ms")
}

// pacedProducer writes pages-1.img and pagemap-1.img as CRIU does (see
// BenchmarkFirstChunkedIngest), then core-1.img and the rw layer.
type pacedProducer struct {
	pages, rootfs []byte
	perMiB        time.Duration
}

func (p *pacedProducer) Checkpoint(ctx context.Context, cp executor.Checkpoint) (executor.CheckpointStats, error) {
	if err := os.MkdirAll(cp.ImageDir, 0o700); err != nil {
		return executor.CheckpointStats{}, err
	}
	pf, err := os.Create(filepath.Join(cp.ImageDir, "pages-1.img"))
	if err != nil {
		return executor.CheckpointStats{}, err
	}
	defer pf.Close()
	mf, err := os.Create(filepath.Join(cp.ImageDir, "pagemap-1.img"))
	if err != nil {
		return executor.CheckpointStats{}, err
	}
	defer mf.Close()
	buf := pagemapImage(1) // the head
	const vaddr = 0x7f0000000000
	start := time.Now()
	for off := 0; off < len(p.pages); off += 1 << 20 {
		n := min(1<<20, len(p.pages)-off)
		entry := pagemapImage(1, run{vaddr + uint64(off), uint64(n)})[len(pagemapImage(1)):]
		if len(buf)+len(entry) > pageSize {
			if _, err := mf.Write(buf); err != nil {
				return executor.CheckpointStats{}, err
			}
			buf = buf[:0]
		}
		buf = append(buf, entry...)
		if _, err := pf.Write(p.pages[off : off+n]); err != nil {
			return executor.CheckpointStats{}, err
		}
		if d := time.Duration(off>>20+1)*p.perMiB - time.Since(start); d > 0 {
			time.Sleep(d)
		}
	}
	if _, err := mf.Write(buf); err != nil {
		return executor.CheckpointStats{}, err
	}
	if err := os.WriteFile(filepath.Join(cp.ImageDir, "core-1.img"), content(63, 300), 0o600); err != nil {
		return executor.CheckpointStats{}, err
	}
	return executor.CheckpointStats{}, os.WriteFile(cp.Rootfs, p.rootfs, 0o600)
}

func (p *pacedProducer) Settle(context.Context) error { return nil }

package park

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/runrecordd/runrecordd/internal/executor"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
)

// BenchmarkResume is a resume's part of an image park: Offered rehashes
// a memory image of one 256 MiB pages file and 2,000 small files and a
// 16 MiB rw layer, then Layout links both trees out.
func BenchmarkResume(b *testing.B) {
	st := mustStore(b)
	images := map[string][]byte{"pages-1.img": content(41, 256<<20)}
	for i := range 2000 {
		images[fmt.Sprintf("core-%d.img", i)] = content(uint64(100+i), 4096)
	}
	mem := plainIngest(b, st, images)
	root := plainIngest(b, st, map[string][]byte{RootfsName: content(42, 16<<20)})
	snap := record.ImageSnapshot(root, &mem)
	b.Run("Offered", func(b *testing.B) {
		for b.Loop() {
			if off, err := Offered(b.Context(), st, snap); err != nil || !off.Equal(snap) {
				b.Fatal(off, err)
			}
		}
	})
	b.Run("Layout", func(b *testing.B) {
		for b.Loop() {
			if _, err := Layout(st, snap, filepath.Join(b.TempDir(), "restore")); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkResumeServed is a served lazy resume's part of an image park
// of 512 MiB (32,768 chunks, every page but the first lazy) and 26 small
// image files, from a warm page cache: Offered is OfferedServed's check,
// Layout LayoutServed's layout and page server manifest alone, Both the
// two, one after the other, as a resume runs them.
func BenchmarkResumeServed(b *testing.B) {
	st := mustStore(b)
	st.SetChunkedImages(true)
	images := lazyImages(content(41, 512<<20))
	for i := range 26 {
		images[fmt.Sprintf("core-%d.img", 100+i)] = content(uint64(100+i), 1000+i*300)
	}
	p := &producer{t: b, images: images, rootfs: content(42, 4096)}
	res, err := Image(b.Context(), st, p, ImageOptions{})
	if err != nil {
		b.Fatal(err)
	}
	snap := res.Snapshot
	offer := func(b *testing.B) {
		if off, err := OfferedServed(b.Context(), st, snap); err != nil || !off.Equal(snap) {
			b.Fatal(off, err)
		}
	}
	dir := b.TempDir()
	layout := func(b *testing.B) {
		d := filepath.Join(dir, "restore")
		if _, m, err := LayoutServed(st, snap, d); err != nil || len(m.Tasks) != 1 {
			b.Fatal(err)
		}
		if err := os.RemoveAll(d); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("Offered", func(b *testing.B) {
		for b.Loop() {
			offer(b)
		}
	})
	b.Run("Layout", func(b *testing.B) {
		for b.Loop() {
			layout(b)
		}
	})
	b.Run("Both", func(b *testing.B) {
		for b.Loop() {
			offer(b)
			layout(b)
		}
	})
}

// fastProducer writes its images as a dump does, in 1 MiB appends,
// without the pauses of producer.
type fastProducer struct {
	images map[string][]byte
	rootfs []byte
}

func (p *fastProducer) Checkpoint(ctx context.Context, cp executor.Checkpoint) (executor.CheckpointStats, error) {
	if err := os.MkdirAll(cp.ImageDir, 0o700); err != nil {
		return executor.CheckpointStats{}, err
	}
	for name, b := range p.images {
		f, err := os.OpenFile(filepath.Join(cp.ImageDir, name), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return executor.CheckpointStats{}, err
		}
		for off := 0; off < len(b); off += 1 << 20 {
			if _, err := f.Write(b[off:min(off+1<<20, len(b))]); err != nil {
				f.Close()
				return executor.CheckpointStats{}, err
			}
		}
		if err := f.Close(); err != nil {
			return executor.CheckpointStats{}, err
		}
	}
	return executor.CheckpointStats{}, os.WriteFile(cp.Rootfs, p.rootfs, 0o600)
}

func (p *fastProducer) Settle(context.Context) error { return nil }

// BenchmarkChunkedVsWhole parks a 256 MiB memory image into a new store
// with chunked images off and on, in alternating order, each round: the
// first park (Image), its eager resume (Offered, then Layout), a second
// park after 1% of the pages changed (spread; the chunked one given the
// first as its base) and that park's eager resume. It reports each
// step's median for both and the ratio chunked/whole, and the second
// chunked park's new bytes as a share of the image.
func BenchmarkChunkedVsWhole(b *testing.B) {
	pages := content(41, 256<<20)
	pages2 := bytes.Clone(pages)
	r := rand.New(rand.NewPCG(7, 7))
	n := len(pages) / pageSize
	for range n / 100 {
		pages2[r.IntN(n)*pageSize+100] ^= 0xff
	}
	rootfs := content(42, 64<<10)
	steps := []string{"park", "resume", "park2", "resume2"}
	times := map[string][2][]time.Duration{}
	add := func(step string, k int, d time.Duration) {
		t := times[step]
		t[k] = append(t[k], d)
		times[step] = t
	}
	var share []float64
	round := func(b *testing.B, k int) {
		st, err := store.Open(filepath.Join(b.TempDir(), "store"))
		if err != nil {
			b.Fatal(err)
		}
		defer st.Close()
		st.SetChunkedImages(k == 1)
		var base *record.Address
		for i, pg := range [][]byte{pages, pages2} {
			t0 := time.Now()
			res, err := Image(b.Context(), st, &fastProducer{images: chunkedImages(pg), rootfs: rootfs}, ImageOptions{Base: base})
			if err != nil {
				b.Fatal(err)
			}
			add(steps[2*i], k, time.Since(t0))
			t0 = time.Now()
			if off, err := Offered(b.Context(), st, res.Snapshot); err != nil || !off.Equal(res.Snapshot) {
				b.Fatal(off, err)
			}
			dir := filepath.Join(b.TempDir(), "restore")
			if _, err := Layout(st, res.Snapshot, dir); err != nil {
				b.Fatal(err)
			}
			add(steps[2*i+1], k, time.Since(t0))
			if err := os.RemoveAll(dir); err != nil {
				b.Fatal(err)
			}
			if i == 1 && k == 1 {
				share = append(share, float64(res.NewBytes)/float64(len(pages)))
			}
			base = res.Snapshot.Memory
		}
	}
	i := 0
	for b.Loop() {
		round(b, i%2)
		round(b, 1-i%2)
		i++
	}
	med := func(ds []time.Duration) time.Duration {
		s := slices.Clone(ds)
		slices.Sort(s)
		return s[len(s)/2]
	}
	for _, step := range steps {
		w, c := med(times[step][0]), med(times[step][1])
		b.ReportMetric(float64(w.Milliseconds()), step+"-whole-ms")
		b.ReportMetric(float64(c.Milliseconds()), step+"-chunked-ms")
		b.ReportMetric(float64(c)/float64(w), step+"-ratio")
	}
	slices.Sort(share)
	b.ReportMetric(100*share[len(share)/2], "park2-new-%")
}

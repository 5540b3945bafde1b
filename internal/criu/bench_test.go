package criu

import (
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkCheck is the check a restore runs (criu.Read, PolicyOf the
// container's spec, Judge) over the oracle's images beside the pages of
// a 512 MiB unit (a sparse file: the pages are never read, so only their
// name and size are looked at).
func BenchmarkCheck(b *testing.B) {
	dir := oracle(b)
	if err := os.Truncate(filepath.Join(dir, "pages-1.img"), 0); err != nil && !os.IsNotExist(err) {
		b.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "pages-1.img"))
	if err != nil {
		b.Fatal(err)
	}
	if err := f.Truncate(512 << 20); err != nil {
		b.Fatal(err)
	}
	f.Close()
	spec := sandboxSpec(b)
	b.ResetTimer()
	for b.Loop() {
		p, err := PolicyOf(spec)
		if err != nil {
			b.Fatal(err)
		}
		im, err := Read(dir)
		if err != nil {
			b.Fatal(err)
		}
		if err := im.Judge(p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCheckAndStack is BenchmarkCheck with the restore's rewrite
// of the images that pass, as at a park's first restore: the spec's
// filter (one of runc's size, 1269 instructions) stacked on every
// thread, seccomp.img and the cores written again. Each round works on a
// fresh copy of the oracle's images, made with the timer stopped.
func BenchmarkCheckAndStack(b *testing.B) {
	spec := sandboxSpec(b)
	host := []Filter{hostFilter(1269)}
	for b.Loop() {
		b.StopTimer()
		dir := oracle(b)
		b.StartTimer()
		p, err := PolicyOf(spec)
		if err != nil {
			b.Fatal(err)
		}
		im, err := Read(dir)
		if err != nil {
			b.Fatal(err)
		}
		if err := im.Judge(p); err != nil {
			b.Fatal(err)
		}
		if err := im.Stack(dir, host); err != nil {
			b.Fatal(err)
		}
	}
}

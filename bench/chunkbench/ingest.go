package main

import (
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// ingest measures, in dir (on the store's filesystem), what storing image
// a's largest pages file costs whole (write, fsync, rename: a put) and as
// vaddr-16k chunk files (each written under objects/tmp and renamed into
// one of 64 shards, one syncfs for all: an ingest), then image b's new
// chunks only, the disk the chunk files take, and assembling the pages
// file again from them with every chunk verified at its offset (what an
// eager restore from chunks would read). Everything under dir is removed.
func ingest(dir string, a, b *image) error {
	if err := os.MkdirAll(filepath.Join(dir, "objects", "tmp"), 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	for i := range 64 {
		if err := os.MkdirAll(filepath.Join(dir, "objects", fmt.Sprintf("%02x", i)), 0o700); err != nil {
			return err
		}
	}
	c := byName("vaddr-16k")
	pm, p := largest(a)
	fmt.Printf("\ningest into %s, %s (%s):\n", dir, pm.pagesName, mib(int64(len(p))))
	t := time.Now()
	if err := put(filepath.Join(dir, "objects", "tmp", "whole"), filepath.Join(dir, "whole"), p, true); err != nil {
		return err
	}
	fmt.Printf("  whole: write, fsync, rename  %s\n", rate(len(p), time.Since(t)))
	stored := map[key]bool{}
	n, d, err := putChunks(dir, c, pm, p, stored)
	if err != nil {
		return err
	}
	fmt.Printf("  %s: %d chunk files, one syncfs  %s\n", c.name, n, rate(len(p), d))
	pmb, pb := largest(b)
	n, d, err = putChunks(dir, c, pmb, pb, stored)
	if err != nil {
		return err
	}
	fmt.Printf("  the next image's new chunks: %d files, %s\n", n, dur(d))
	var blocks int64
	_ = filepath.Walk(filepath.Join(dir, "objects"), func(path string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			blocks += fi.Sys().(*syscall.Stat_t).Blocks * 512
		}
		return nil
	})
	fmt.Printf("  disk taken by the chunk files of both: %s (blocks)\n", mib(blocks))
	return assemble(dir, c, pm, p)
}

func largest(im *image) (pagemap, []byte) {
	pm := im.maps[0]
	for _, m := range im.maps {
		if m.pagesBytes > pm.pagesBytes {
			pm = m
		}
	}
	return pm, im.pages[pm.pagesName]
}

func dur(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/1e6) }

func put(tmp, dst string, b []byte, sync bool) error {
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o400)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if sync {
		if err := f.Sync(); err != nil {
			f.Close()
			return err
		}
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, dst)
}

func chunkPath(dir string, k key) string {
	return filepath.Join(dir, "objects", fmt.Sprintf("%02x", k[0]&63), hex.EncodeToString(k[:]))
}

// putChunks stores p's chunks that stored lacks, as an ingest does:
// written, renamed, one syncfs.
func putChunks(dir string, c *chunker, pm pagemap, p []byte, stored map[key]bool) (int, time.Duration, error) {
	t := time.Now()
	n := 0
	for _, s := range c.cut(pm, p) {
		b := p[s.off : s.off+s.n]
		k := key(rootOf(b))
		if stored[k] {
			continue
		}
		stored[k] = true
		if err := put(filepath.Join(dir, "objects", "tmp", "c"), chunkPath(dir, k), b, false); err != nil {
			return 0, 0, err
		}
		n++
	}
	f, err := os.Open(dir)
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return 0, 0, err
	}
	return n, time.Since(t), nil
}

// assemble writes the pages file again from its chunk files (from the
// page cache), each 64 KiB block checked against its chaining value at its
// offset as soon as the chunks covering it are in.
func assemble(dir string, c *chunker, pm pagemap, p []byte) error {
	spans := c.cut(pm, p)
	want := boundCVs(p, block)
	keys := make([]key, len(spans))
	for i, s := range spans {
		keys[i] = key(rootOf(p[s.off : s.off+s.n]))
	}
	out, err := os.Create(filepath.Join(dir, "assembled"))
	if err != nil {
		return err
	}
	defer out.Close()
	buf := make([]byte, len(p))
	t := time.Now()
	next := int64(0) // the next block to check
	for i, s := range spans {
		b := buf[s.off : s.off+s.n]
		f, err := os.Open(chunkPath(dir, keys[i]))
		if err != nil {
			return err
		}
		_, err = f.ReadAt(b, 0)
		f.Close()
		if err != nil {
			return err
		}
		for end := s.off + s.n; next < end && (next+1)*block <= end || end == int64(len(buf)) && next*block < end; next++ {
			lo := next * block
			if subtreeCV(buf[lo:min(lo+block, end)], uint64(lo)/1024) != want[next] {
				return fmt.Errorf("block %d does not verify", next)
			}
		}
		if _, err := out.Write(b); err != nil {
			return err
		}
	}
	if next != int64(len(want)) {
		return fmt.Errorf("checked %d blocks of %d", next, len(want))
	}
	fmt.Printf("  assembled from %d chunk files, every 64 KiB block verified at its offset (page cache)  %s\n", len(spans), rate(len(p), time.Since(t)))
	return nil
}

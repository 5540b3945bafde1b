// Command ballast is a big-memory unit for park benchmarks: it allocates
// SIZE_MB MiB (default 512), writes a distinct 8-byte word into every 4 KiB
// page so each page is private, resident and not a shared zero page, prints
// one JSON line saying it is ready, then ticks every TICK_MS (default 1000)
// with one JSON line. Every VERIFY_EVERY ticks (default 10) it re-reads the
// word of every page; a mismatch prints a line with "error" and exits 3.
//
// For the chunked-image benchmark (bench/chunks.sh, docs/chunked-images.md)
// two more settings: FILL=random fills the rest of every page with
// pseudo-random bytes (xorshift) instead of leaving it zero, so pages look
// like data, not like zero pages with one word; and each SIGUSR2 changes
// CHANGE_PCT percent (default 1) of the buffer, as CHANGE_MODE says: spread
// (that many whole pages, chosen at random over the buffer), contiguous (one
// run of that many pages at a random place) or lines (that many bytes as
// 64-byte lines at random places, the worst case for page-sized chunks),
// then prints a line whose "changes" counts the changes made. A change never
// touches a page's verified word.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

const pageSize = 4096

// Line is one report.
type Line struct {
	Counter   uint64 `json:"counter"`
	SizeMB    int    `json:"size_mb"`
	Pages     int    `json:"pages"`
	Verified  uint64 `json:"verified_at"`
	Pid       int    `json:"pid"`
	StartTime int64  `json:"start_time"`
	TouchNS   int64  `json:"touch_ns"`
	Time      int64  `json:"time"`
	Changes   uint64 `json:"changes,omitempty"`
	Error     string `json:"error,omitempty"`
}

func envInt(name string, def int) int {
	if v := os.Getenv(name); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			return n
		}
	}
	return def
}

func word(page int) uint64 { return uint64(page)*0x9E3779B97F4A7C15 | 1 }

func main() {
	start := time.Now()
	sizeMB := envInt("SIZE_MB", 512)
	tick := time.Duration(envInt("TICK_MS", 1000)) * time.Millisecond
	verifyEvery := uint64(envInt("VERIFY_EVERY", 10))

	pages := sizeMB << 20 / pageSize
	mem := make([]uint64, pages*pageSize/8)
	random := os.Getenv("FILL") == "random"
	rng := uint64(0x243F6A8885A308D3)
	for p := 0; p < pages; p++ {
		mem[p*pageSize/8] = word(p)
		if random {
			fill(mem[p*pageSize/8+1:(p+1)*pageSize/8], &rng)
		}
	}
	changes := make(chan os.Signal, 1)
	signal.Notify(changes, syscall.SIGUSR2)
	enc := json.NewEncoder(os.Stdout)
	line := Line{
		SizeMB:    sizeMB,
		Pages:     pages,
		Pid:       os.Getpid(),
		StartTime: start.UnixNano(),
		TouchNS:   time.Since(start).Nanoseconds(),
	}
	emit := func() {
		line.Time = time.Now().UnixNano()
		if err := enc.Encode(&line); err != nil {
			fmt.Fprintln(os.Stderr, "ballast:", err)
			os.Exit(1)
		}
	}
	emit()
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-changes:
			change(mem, pages, envInt("CHANGE_PCT", 1), os.Getenv("CHANGE_MODE"), &rng)
			line.Changes++
			emit()
			continue
		case <-t.C:
		}
		line.Counter++
		if line.Counter%verifyEvery == 0 {
			for p := 0; p < pages; p++ {
				if got := mem[p*pageSize/8]; got != word(p) {
					line.Error = fmt.Sprintf("page %d holds %#x, want %#x", p, got, word(p))
					emit()
					os.Exit(3)
				}
			}
			line.Verified = line.Counter
		}
		emit()
	}
}

func next(x *uint64) uint64 {
	*x ^= *x << 13
	*x ^= *x >> 7
	*x ^= *x << 17
	return *x
}

func fill(words []uint64, rng *uint64) {
	for i := range words {
		words[i] = next(rng)
	}
}

// change rewrites pct percent of mem (see the package doc), never a
// page's first word.
func change(mem []uint64, pages, pct int, mode string, rng *uint64) {
	n := pages * pct / 100
	const w = pageSize / 8
	switch mode {
	case "contiguous":
		first := int(next(rng) % uint64(pages-n+1))
		for p := first; p < first+n; p++ {
			fill(mem[p*w+1:(p+1)*w], rng)
		}
	case "lines":
		for i := 0; i < n*pageSize/64; i++ {
			p, l := int(next(rng)%uint64(pages)), 1+int(next(rng)%(pageSize/64-1))
			fill(mem[p*w+l*8:p*w+l*8+8], rng)
		}
	default: // spread
		for i := 0; i < n; i++ {
			p := int(next(rng) % uint64(pages))
			fill(mem[p*w+1:(p+1)*w], rng)
		}
	}
}

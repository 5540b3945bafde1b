// Command ballast is a big-memory unit for park benchmarks: it allocates
// SIZE_MB MiB (default 512), writes a distinct 8-byte word into every 4 KiB
// page so each page is private, resident and not a shared zero page, prints
// one JSON line saying it is ready, then ticks every TICK_MS (default 1000)
// with one JSON line. Every VERIFY_EVERY ticks (default 10) it re-reads the
// word of every page; a mismatch prints a line with "error" and exits 3.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
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
	for p := 0; p < pages; p++ {
		mem[p*pageSize/8] = word(p)
	}
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
	for range t.C {
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

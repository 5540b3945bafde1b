// Command chunkbench measures what content-addressed chunks of CRIU memory
// images would store (issue 15, "parks store only what changed";
// docs/chunked-images.md). Two subcommands:
//
//	chunkbench dump -out DIR [-unit ballast] [-n 5] [-size 256] [-pct 1] [-mode spread]
//
// (as root; bench/chunks.sh wraps it) starts a ballast unit (units/ballast,
// FILL=random) in a private containerd through the executor and takes n
// full CRIU dumps of it into DIR/1, DIR/2, …, each with the task left
// frozen and then resumed (Checkpoint.Keep, as a park does), with one
// SIGUSR2 between two dumps: the unit changes pct percent of its memory
// (CHANGE_MODE: spread, contiguous or lines). -unit oracle dumps the
// oracle instead (units/oracle: two processes, loopback TCP), a second of
// its own ticks between two dumps and no other change.
//
//	chunkbench analyze [-ingest DIR] DIR1 DIR2 …
//
// reads two or more CRIU image directories, in park order, and prints how
// each image's memory lies against the one before (pagemap entries,
// pages kept, changed, moved), then per chunking — the whole file (today),
// fixed 4 KiB pages, fixed 64 KiB and 1 MiB chunks at file offsets (bound
// to BLAKE3's tree), at pagemap entries or at virtual addresses, and
// FastCDC at 16 and 64 KiB — the chunks per image, the chunk list's
// bytes, the bytes each image adds to a store holding the ones before it
// and what they all take against one image; then the hashing costs.
// Never run by `make test`: no test files, and the dump needs root.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch os.Args[1] {
	case "dump":
		fs := flag.NewFlagSet("dump", flag.ExitOnError)
		out := fs.String("out", "", "directory for the dumps (created; DIR/1 … DIR/n)")
		n := fs.Int("n", 5, "dumps")
		size := fs.Int("size", 256, "the ballast's memory, MiB (at most 512)")
		pct := fs.Int("pct", 1, "percent of the memory changed between two dumps")
		unitName := fs.String("unit", "ballast", "the unit: ballast, or oracle (64 MiB default there: -size 64; no changes but its own)")
		mode := fs.String("mode", "spread", "how: spread (whole pages at random), contiguous (one run of pages), lines (64-byte lines at random)")
		_ = fs.Parse(os.Args[2:])
		if *out == "" || *size > 512 || *n < 1 {
			usage()
		}
		err = dump(dumpPlan{out: *out, unit: *unitName, n: *n, size: *size, pct: *pct, mode: *mode})
	case "analyze":
		fs := flag.NewFlagSet("analyze", flag.ExitOnError)
		in := fs.String("ingest", "", "also time storing image 1 whole and as chunk files, and the next image's new chunks, in this new directory (on the store's filesystem; removed after)")
		_ = fs.Parse(os.Args[2:])
		err = analyze(fs.Args(), *in)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "chunkbench:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: chunkbench dump -out DIR [-unit ballast|oracle] [-n 5] [-size 256] [-pct 1] [-mode spread|contiguous|lines]\n       chunkbench analyze [-ingest DIR] DIR1 DIR2 ...")
	os.Exit(2)
}

func analyze(dirs []string, in string) error {
	if len(dirs) < 2 {
		return fmt.Errorf("analyze needs two or more image directories")
	}
	var ims []*image
	for i, d := range dirs {
		im, err := readImage(d)
		if err != nil {
			return err
		}
		describe(i, im)
		if i > 0 {
			layout(ims[i-1], im)
		}
		ims = append(ims, im)
	}
	stores(ims)
	example(ims[0], ims[1])
	if err := hashing(ims[0]); err != nil {
		return err
	}
	if in != "" {
		return ingest(in, ims[0], ims[1])
	}
	return nil
}

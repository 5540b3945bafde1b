// Command mkunit builds a demo unit — a static Go program — and packs it as
// an OCI image archive that `runrecordd images import` (or `ctr images
// import`) reads:
//
//	mkunit -o bin/units/oracle.tar -name runrecordd.local/oracle:1 ./units/oracle
//
// The archive is reproducible: the same source and toolchain give the same
// bytes, so the same image digest. It prints the image's manifest digest.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/runrecordd/runrecordd/internal/ociarchive"
)

func main() {
	out := flag.String("o", "", "archive to write")
	name := flag.String("name", "", "image name, e.g. runrecordd.local/oracle:1")
	dir := flag.String("C", ".", "module directory the package path is resolved in")
	flag.Parse()
	if *out == "" || *name == "" || flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: mkunit -o ARCHIVE -name NAME [-C DIR] PACKAGE")
		os.Exit(2)
	}
	bin, err := ociarchive.GoBinary(context.Background(), *dir, flag.Arg(0))
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkunit:", err)
		os.Exit(1)
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		fmt.Fprintln(os.Stderr, "mkunit:", err)
		os.Exit(1)
	}
	d, err := ociarchive.WriteFile(*out, ociarchive.Unit(*name, bin))
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkunit:", err)
		os.Exit(1)
	}
	fmt.Println(d.Manifest)
}

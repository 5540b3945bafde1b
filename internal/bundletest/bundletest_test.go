package bundletest

import (
	"archive/tar"
	"bytes"
	"io"
	"testing"
)

// The sparse member really is what the finding says: a few blocks of tar
// that archive/tar reads as a regular file of the full size.
func TestSparseReadsLarge(t *testing.T) {
	const size = 8 << 20
	raw := append(Sparse("objects/x", size), make([]byte, 1024)...)
	tr := tar.NewReader(bytes.NewReader(raw))
	hdr, err := tr.Next()
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, tr)
	if err != nil || hdr.Name != "objects/x" || hdr.Typeflag != tar.TypeReg || hdr.Size != size || n != size || len(raw) > 4096 {
		t.Fatalf("%+v: read %d, %v (from %d bytes)", hdr, n, err, len(raw))
	}
}

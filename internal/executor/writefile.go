//go:build linux

package executor

import (
	"io"
	"os"

	"github.com/runrecordd/runrecordd/internal/atomicfile"
)

// writeFileWhole writes r to path through a temporary file beside it and a
// rename, so that path is never seen half-written; with durable, the file
// is fsynced before the rename and the directory after.
func writeFileWhole(path string, r io.Reader, durable bool) (int64, error) {
	var n int64
	write := func(f *os.File) (err error) {
		n, err = io.Copy(f, r)
		return err
	}
	put := atomicfile.WriteNoSync
	if durable {
		put = atomicfile.Write
	}
	if err := put(path, 0o600, write); err != nil {
		return 0, err
	}
	return n, nil
}

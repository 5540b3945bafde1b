package daemon

import (
	"os"
	"path/filepath"
)

// writeDurable writes b to path through a temporary file renamed over it,
// so a reader sees the old bytes or the new, never a part, and fsyncs the
// file before the rename and the directory after it — a result the API
// acknowledged survives a crash.
func writeDurable(path string, b []byte) error { return replace(path, b, true) }

func replace(path string, b []byte, durable bool) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if durable {
		if err := tmp.Sync(); err != nil {
			tmp.Close()
			return err
		}
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	if !durable {
		return nil
	}
	dir, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer dir.Close()
	return dir.Sync()
}

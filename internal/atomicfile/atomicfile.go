// Package atomicfile writes a file whole or not at all: the content goes
// to a temporary file in the target's directory, which is then renamed
// over the target ([Write]) or linked to it if it is absent ([Create]).
// A reader never sees a part, and a failed write leaves the target as it
// was and no temporary file behind.
//
// # Why each sync
//
// Durability takes two fsyncs, and this is the one place that says why:
//
//   - The temporary file is fsynced before the rename (or link), so that the
//     name never points at unwritten data after a crash. Filesystems may
//     commit the rename before the data: without the fsync, a power loss
//     can leave the new name over an empty or short file, which is worse
//     than the old content or none.
//   - The directory is fsynced after the rename, so that the rename itself
//     survives a crash. A name is an entry in its directory, and until the
//     directory is written back a crash can take the new name back, leaving
//     the old content (or no file) although the call reported success.
//
// [WriteNoSync] skips both, for files that need only the atomic swap (a
// reader sees the old content or the new) and are rebuilt, or written back
// by a later sync, after a crash. [SyncDir] is the second sync alone, for
// callers that rename files of their own (the store's objects).
package atomicfile

import (
	"fmt"
	"os"
	"path/filepath"
)

// Write writes path whole and durably, replacing any file there: write
// fills a new temporary file in path's directory (its offset at 0), which
// gets mode perm (not masked by the umask), is fsynced, renamed over path,
// and the directory fsynced. On any error, write's included and returned
// as it is, path is left as it was and the temporary file is removed.
func Write(path string, perm os.FileMode, write func(*os.File) error) error {
	return replace(path, perm, write, true)
}

// WriteNoSync is [Write] without either fsync: a reader sees the old
// content or the new, never a part, but after a crash path may hold either,
// or on some filesystems an empty file. For scratch files and files that a
// later sync writes back.
func WriteNoSync(path string, perm os.FileMode, write func(*os.File) error) error {
	return replace(path, perm, write, false)
}

// Create writes path whole and durably if nothing is there, as [Write]
// does, but links the temporary file to path instead of renaming it over,
// so that a file already there is never replaced, even one another process
// creates meanwhile. A present path is an error wrapping fs.ErrExist, and
// is left intact.
func Create(path string, perm os.FileMode, write func(*os.File) error) error {
	tmp, err := temp(path, perm, write, true)
	if err != nil {
		return err
	}
	err = os.Link(tmp, path)
	// The temporary name goes either way; the link is the file now.
	if rerr := os.Remove(tmp); err == nil && rerr != nil {
		err = rerr
	}
	if err != nil {
		return err
	}
	return SyncDir(filepath.Dir(path))
}

// SyncDir fsyncs directory dir, so that the names created, renamed or
// removed in it survive a crash.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}

func replace(path string, perm os.FileMode, write func(*os.File) error, durable bool) error {
	tmp, err := temp(path, perm, write, durable)
	if err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return err
	}
	if !durable {
		return nil
	}
	return SyncDir(filepath.Dir(path))
}

// temp writes a temporary file beside path with write, sets its mode,
// fsyncs it if durable and closes it, and returns its name; on error it is
// removed.
func temp(path string, perm os.FileMode, write func(*os.File) error, durable bool) (name string, err error) {
	if perm&^os.ModePerm != 0 {
		return "", fmt.Errorf("atomicfile: %s: mode %v beyond the permission bits", path, perm)
	}
	base := filepath.Base(path)
	if len(base) > 64 {
		base = base[:64] // the temporary name must fit NAME_MAX too
	}
	f, err := os.CreateTemp(filepath.Dir(path), "."+base+".tmp-*")
	if err != nil {
		return "", err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	if err := f.Chmod(perm); err != nil {
		return "", err
	}
	if err := write(f); err != nil {
		return "", err
	}
	if durable {
		if err := f.Sync(); err != nil {
			return "", err
		}
	}
	// Closed here, not only deferred: a close can report a failed write.
	if err := f.Close(); err != nil {
		return "", err
	}
	return f.Name(), nil
}

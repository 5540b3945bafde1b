package executor

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"time"
)

// The embedded containerd's log: containerd.log holds about
// containerdLogMax bytes at most, and containerd.log.1 the bytes before
// them (docs/daemon.md, "Logs").
const (
	containerdLogMax   = 16 << 20
	containerdLogKeep  = 1
	containerdLogCheck = 10 * time.Second
)

// cappedLog is a log file a child process appends to (O_APPEND, so that
// it writes at the end whatever the file's size), kept to about max bytes
// by rotate: the file is copied to PATH.1, older copies shifted up to
// PATH.KEEP, and truncated in place. The child keeps its descriptor and
// never blocks on its log; what it writes between the copy and the
// truncation (a moment) is lost.
type cappedLog struct {
	path string
	max  int64
	keep int // the copies kept: PATH.1 … PATH.keep (at least 1)
}

// rotate rotates the log if it holds max bytes or more, and says whether
// it did. A log that does not exist is left so.
func (l cappedLog) rotate() (bool, error) {
	st, err := os.Stat(l.path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if st.Size() < l.max {
		return false, nil
	}
	for i := max(l.keep, 1) - 1; i >= 1; i-- {
		err := os.Rename(l.gen(i), l.gen(i+1))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return false, err
		}
	}
	if err := l.copyTo(l.gen(1)); err != nil {
		return false, err
	}
	if err := os.Truncate(l.path, 0); err != nil {
		return false, fmt.Errorf("truncate %s: %w", l.path, err)
	}
	return true, nil
}

// gen is the path of the i-th copy.
func (l cappedLog) gen(i int) string { return l.path + "." + strconv.Itoa(i) }

// copyTo copies the log to dst, whole or not at all.
func (l cappedLog) copyTo(dst string) error {
	src, err := os.Open(l.path)
	if err != nil {
		return err
	}
	defer src.Close()
	tmp := dst + ".tmp"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, src)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("copy %s: %w", l.path, err)
	}
	return nil
}

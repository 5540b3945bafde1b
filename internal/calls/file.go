package calls

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrTranscript is a transcript file the daemon will not read: not a
// regular file it made (a symlink, a FIFO, a device, a directory, a file
// with another link), or larger than the run's transcript limit.
var ErrTranscript = errors.New("transcript refused")

// openBeneath opens rel, a relative path beneath the directory dir,
// without following a symlink in any component, without crossing a mount
// and without blocking (O_NONBLOCK: a FIFO does not wait for a writer),
// and checks that it is a regular file with one link. flags add to
// O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC.
func openBeneath(dir, rel string, flags int) (*os.File, error) {
	d, err := os.OpenFile(dir, os.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	flags |= unix.O_NOFOLLOW | unix.O_NONBLOCK | unix.O_CLOEXEC
	fd, err := unix.Openat2(int(d.Fd()), rel, &unix.OpenHow{
		Flags:   uint64(flags),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV,
	})
	if errors.Is(err, unix.ENOSYS) {
		fd, err = openNoFollow(int(d.Fd()), rel, flags)
	}
	if err != nil {
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.ENOTDIR) {
			return nil, fmt.Errorf("%w: %s: a symlink or a mount on its path (%v)", ErrTranscript, rel, err)
		}
		return nil, &os.PathError{Op: "open", Path: filepath.Join(dir, rel), Err: err}
	}
	f := os.NewFile(uintptr(fd), filepath.Join(dir, rel))
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Nlink != 1 {
		f.Close()
		return nil, fmt.Errorf("%w: %s is not a regular file with one link (mode %#o, %d links)", ErrTranscript, rel, st.Mode, st.Nlink)
	}
	return f, nil
}

// openNoFollow is openBeneath's path walk where openat2 is missing: each
// component opened from the last with O_NOFOLLOW.
func openNoFollow(dirfd int, rel string, flags int) (int, error) {
	parts := strings.Split(filepath.Clean(rel), "/")
	cur := -1
	defer func() {
		if cur >= 0 {
			unix.Close(cur)
		}
	}()
	at := dirfd
	for i, p := range parts {
		if p == ".." || p == "." || p == "" {
			return -1, unix.EXDEV
		}
		if i == len(parts)-1 {
			return unix.Openat(at, p, flags, 0)
		}
		next, err := unix.Openat(at, p, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, err
		}
		if cur >= 0 {
			unix.Close(cur)
		}
		cur, at = next, next
	}
	return -1, unix.ENOENT
}

// ReadTranscript opens the transcript file rel beneath dir for reading,
// as openBeneath opens it — no symlink, no mount crossed, no FIFO waited
// on, a regular file with one link — refusing one larger than limit bytes
// ([ErrTranscript]). A restarted daemon recovers a transcript whose
// channel died with the last one this way: the file is in a directory a
// unit's sandbox mounted.
func ReadTranscript(dir, rel string, limit uint64) (*os.File, error) {
	f, err := openBeneath(dir, rel, os.O_RDONLY)
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err == nil && uint64(st.Size()) > limit {
		err = fmt.Errorf("%w: %s holds %d bytes, more than the run's transcript limit of %d", ErrTranscript, rel, st.Size(), limit)
	}
	if err != nil {
		f.Close()
		return nil, err
	}
	return f, nil
}

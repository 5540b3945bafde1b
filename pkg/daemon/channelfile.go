package daemon

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/runrecordd/runrecordd/pkg/attest"
	"github.com/runrecordd/runrecordd/pkg/record"
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

// readTranscript reads the transcript file rel beneath dir, as
// openBeneath opens it, refusing one larger than limit bytes.
func readTranscript(dir, rel string, limit uint64) (*os.File, error) {
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

// maxScannedEntry bounds an entry scanJournal hands over: larger than any
// entry the channel writes (a request line is at most 1 MiB).
const maxScannedEntry = 4 << 20

// scanJournal reads the journal of the interval attested at att as a
// stream, verified against its address as it is read, and calls fn with
// each entry of a kind in kinds (others are skipped unread), so that a
// journal is never held whole in memory. fn's entries are only to be
// trusted when scanJournal returns nil: the object is verified at its end.
func (d *Daemon) scanJournal(att record.Address, kinds []attest.EntryKind, fn func(attest.Entry)) error {
	body, err := d.attestation(att)
	if err != nil {
		return err
	}
	r, err := d.st.Open(body.Journal)
	if err != nil {
		return err
	}
	defer r.Close()
	br := bufio.NewReader(r)
	head := make([]byte, len(attest.JournalDomain)+4)
	if _, err := io.ReadFull(br, head); err != nil || string(head[:len(attest.JournalDomain)]) != attest.JournalDomain {
		return fmt.Errorf("%w: journal %s: no journal header", attest.ErrMalformed, body.Journal)
	}
	n := binary.BigEndian.Uint32(head[len(attest.JournalDomain):])
	var eh [13]byte
	for range n {
		if _, err := io.ReadFull(br, eh[:]); err != nil {
			return fmt.Errorf("%w: journal %s: %v", attest.ErrMalformed, body.Journal, err)
		}
		e := attest.Entry{Kind: attest.EntryKind(eh[0]), AtNS: int64(binary.BigEndian.Uint64(eh[1:9]))}
		size := int64(binary.BigEndian.Uint32(eh[9:13]))
		want := false
		for _, k := range kinds {
			want = want || k == e.Kind
		}
		if !want || size > maxScannedEntry {
			if _, err := io.CopyN(io.Discard, br, size); err != nil {
				return fmt.Errorf("%w: journal %s: %v", attest.ErrMalformed, body.Journal, err)
			}
			continue
		}
		e.Data = make([]byte, size)
		if _, err := io.ReadFull(br, e.Data); err != nil {
			return fmt.Errorf("%w: journal %s: %v", attest.ErrMalformed, body.Journal, err)
		}
		fn(e)
	}
	// The end: trailing bytes are malformed, and reading to EOF verifies
	// the object against its address.
	if extra, err := io.Copy(io.Discard, br); err != nil {
		return err
	} else if extra != 0 {
		return fmt.Errorf("%w: journal %s: trailing bytes", attest.ErrMalformed, body.Journal)
	}
	return nil
}

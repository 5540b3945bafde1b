//go:build linux

package executor

import (
	"archive/tar"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strings"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/idmap"
)

// The rw layer of a sandbox with a user namespace holds host ids on disk
// (its upper directory is not idmapped: userns.go). Its tar, as a park
// stores it and a bundle carries it, holds in-namespace ids only: a
// checkpoint moves every id from the sandbox's range to 0..idmap.Size-1
// (shiftTar), and a restore moves them into its own range, refusing
// whatever no sandbox's layer could hold (shiftedIn). The ids are each
// member's owner (uid and gid) and the root id of a revision 3 file
// capability (security.capability, which the kernel writes with the host
// id of the namespace's root when a unit sets one).

// errOwner is a rw layer member with an id (owner, file capability's
// root) outside the range it is moved from.
var errOwner = errors.New("an id outside the sandbox's range")

// errXattr is a rw layer member with an xattr other than
// security.capability, the only one a layer written here carries
// (containerd's archive.ChangeWriter), or with a security.capability
// the kernel would not have written; a restore would set any other as
// the host's root (trusted.overlay.*, ACLs naming host ids).
var errXattr = errors.New("an xattr no rw layer written here carries")

// rwLayerImage is how a refusal of the rw layer names it
// (criu.RefusedError.Image).
const rwLayerImage = "rw layer"

// memberError is a refused member of a rw layer: its name, the field and
// why (wrapping errOwner or errXattr).
type memberError struct {
	name, field string
	err         error
}

func (e *memberError) Error() string {
	return fmt.Sprintf("rw layer: %s: %s: %v", e.name, e.field, e.err)
}

func (e *memberError) Unwrap() error { return e.err }

const (
	paxXattr = "SCHILY.xattr."
	capXattr = "security.capability"
	// capV3Size is the size of struct vfs_ns_cap_data, whose last
	// little-endian u32 is the root id; its first u32's top byte is the
	// revision.
	capV3Size    = 24
	capRevision3 = 0x03
)

// shiftTar copies the tar stream src to dst with every id moved from the
// range at from to the range at to: each member's uid and gid, and a
// revision 3 file capability's root id. An id outside [from,
// from+idmap.Size), or an xattr other than security.capability, is
// refused (a *memberError wrapping errOwner or errXattr). A whiteout's
// owner means nothing (the layer's reader deletes, it makes no file): it
// becomes the range's root, whatever it was.
func shiftTar(dst io.Writer, src io.Reader, from, to uint32) error {
	tr, tw := tar.NewReader(src), tar.NewWriter(dst)
	move := func(name, field string, id int64) (int64, error) {
		if id < int64(from) || id >= int64(from)+idmap.Size {
			return 0, &memberError{name, field, fmt.Errorf("%w: %d", errOwner, id)}
		}
		return id - int64(from) + int64(to), nil
	}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return tw.Close()
		}
		if err != nil {
			return err
		}
		if strings.HasPrefix(path.Base(h.Name), ".wh.") {
			h.Uid, h.Gid = int(to), int(to)
		} else {
			for _, o := range []struct {
				field string
				id    *int
			}{{"uid", &h.Uid}, {"gid", &h.Gid}} {
				n, err := move(h.Name, o.field, int64(*o.id))
				if err != nil {
					return err
				}
				*o.id = int(n)
			}
		}
		for k, v := range h.PAXRecords {
			name, ok := strings.CutPrefix(k, paxXattr)
			if !ok {
				continue
			}
			if name != capXattr {
				return &memberError{h.Name, "xattr", fmt.Errorf("%w: %q", errXattr, name)}
			}
			if h.PAXRecords[k], err = shiftCapability(h.Name, v, move); err != nil {
				return err
			}
		}
		// Read, the xattrs are in both; written, Xattrs would win.
		//lint:ignore SA1019 the reader fills it, and the writer prefers it to PAXRecords
		h.Xattrs = nil
		h.Uname, h.Gname = "", ""
		h.Format = tar.FormatUnknown // the writer picks one that holds the ids
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := io.Copy(tw, tr); err != nil {
			return err
		}
	}
}

// shiftCapability is the security.capability xattr v of member name with
// its root id moved (a revision 3 one; the others name no id); a
// revision 3 one of another size is refused (errXattr).
func shiftCapability(name, v string, move func(name, field string, id int64) (int64, error)) (string, error) {
	if len(v) < 4 || v[3] != capRevision3 {
		return v, nil
	}
	if len(v) != capV3Size {
		return "", &memberError{name, capXattr, fmt.Errorf("%w: a revision 3 capability of %d bytes", errXattr, len(v))}
	}
	b := []byte(v)
	root, err := move(name, capXattr, int64(binary.LittleEndian.Uint32(b[20:])))
	if err != nil {
		return "", err
	}
	binary.LittleEndian.PutUint32(b[20:], uint32(root))
	return string(b), nil
}

// shifted is src with shiftTar applied, read as it is made.
func shifted(src io.Reader, from, to uint32) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(shiftTar(pw, src, from, to)) }()
	return pr
}

// shiftedIn is a stored rw layer src (in-namespace ids) moved into the
// range at base, as a restore applies it: a member it refuses is the
// images' refusal (a *criu.RefusedError naming the field; the API's
// image_refused), read before anything is applied.
func shiftedIn(src io.Reader, base uint32) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		err := shiftTar(pw, src, 0, base)
		var me *memberError
		if errors.As(err, &me) {
			err = &criu.RefusedError{Image: rwLayerImage, Field: me.field, Why: fmt.Sprintf("%s: %v", me.name, me.err)}
		}
		pw.CloseWithError(err)
	}()
	return pr
}

// vetLayer refuses a rw layer tar this host would not have written: one
// with a sparse member (GNU 'S', or GNU.sparse PAX records), whose few
// stored bytes a tar reader expands to the size it declares, or whose
// members declare more bytes than the file holds. It reads the headers
// only, and leaves f at its start.
func vetLayer(f *os.File) error {
	st, err := f.Stat()
	if err != nil {
		return err
	}
	tr := tar.NewReader(f) // f seeks: Next skips each member's data
	var total int64
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return &criu.RefusedError{Image: rwLayerImage, Field: "tar", Why: err.Error()}
		}
		sparse := h.Typeflag == tar.TypeGNUSparse
		for k := range h.PAXRecords {
			sparse = sparse || strings.HasPrefix(k, "GNU.sparse.")
		}
		if sparse {
			return &criu.RefusedError{Image: rwLayerImage, Field: "sparse", Why: fmt.Sprintf("%s: a sparse member (no rw layer written here has one)", h.Name)}
		}
		if h.Typeflag == tar.TypeReg {
			total += h.Size
		}
		if total > st.Size() {
			return &criu.RefusedError{Image: rwLayerImage, Field: "size", Why: fmt.Sprintf("%s: the members declare %d bytes, more than the layer's %d", h.Name, total, st.Size())}
		}
	}
	_, err = f.Seek(0, io.SeekStart)
	return err
}

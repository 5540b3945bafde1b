//go:build linux

package executor

import (
	"archive/tar"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/runrecordd/runrecordd/internal/criu"
	"github.com/runrecordd/runrecordd/internal/idmap"
)

func tarOf(t *testing.T, hs ...*tar.Header) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for _, h := range hs {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write(make([]byte, h.Size)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// members reads the headers of the tar b.
func members(t *testing.T, b []byte) []*tar.Header {
	t.Helper()
	var hs []*tar.Header
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return hs
		}
		if err != nil {
			t.Fatal(err)
		}
		hs = append(hs, h)
	}
}

// capV3 is a security.capability xattr of revision 3 (a file capability
// a user namespace's root set) naming rootid, with CAP_NET_RAW permitted.
func capV3(rootid uint32) string {
	b := make([]byte, 24)
	binary.LittleEndian.PutUint32(b[0:], 0x03000000|1) // revision 3, effective
	binary.LittleEndian.PutUint32(b[4:], 1<<13)
	binary.LittleEndian.PutUint32(b[20:], rootid)
	return string(b)
}

const capKey = "SCHILY.xattr.security.capability"

// TestShiftTar: owners move between ranges both ways (a range past what
// a ustar header holds too), a whiteout's owner is the namespace's root
// whatever it was, and an owner outside the range is refused.
func TestShiftTar(t *testing.T) {
	for _, base := range []int{1<<20 + 5*idmap.Size, idmap.DefaultBase + (idmap.DefaultCount-1)*idmap.Size} {
		in := tarOf(t,
			&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: base, Gid: base},
			&tar.Header{Name: "etc/f", Typeflag: tar.TypeReg, Mode: 0o644, Uid: base + 1000, Gid: base + 65534, Size: 3,
				PAXRecords: map[string]string{capKey: capV3(uint32(base))}},
			&tar.Header{Name: "etc/.wh.gone", Typeflag: tar.TypeReg, Mode: 0o600},
			// A file the unit named like a whiteout: its owner is a host id.
			&tar.Header{Name: "etc/.wh.made", Typeflag: tar.TypeReg, Mode: 0o600, Uid: base + 7, Gid: base + 7},
		)
		var out bytes.Buffer
		if err := shiftTar(&out, bytes.NewReader(in), uint32(base), 0); err != nil {
			t.Fatal(err)
		}
		to := base + idmap.Size
		var back bytes.Buffer
		if err := shiftTar(&back, bytes.NewReader(out.Bytes()), 0, uint32(to)); err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			b      []byte
			owners [][2]int
			rootid uint32
		}{
			{out.Bytes(), [][2]int{{0, 0}, {1000, 65534}, {0, 0}, {0, 0}}, 0},
			{back.Bytes(), [][2]int{{to, to}, {to + 1000, to + 65534}, {to, to}, {to, to}}, uint32(to)},
		} {
			hs := members(t, c.b)
			if len(hs) != len(c.owners) {
				t.Fatalf("%d members, want %d", len(hs), len(c.owners))
			}
			for i, h := range hs {
				if got := [2]int{h.Uid, h.Gid}; got != c.owners[i] {
					t.Errorf("base %d: %s: owner %v, want %v", base, h.Name, got, c.owners[i])
				}
			}
			if got := hs[1].PAXRecords[capKey]; got != capV3(c.rootid) {
				t.Errorf("base %d: %s: capability %x, want rootid %d", base, hs[1].Name, got, c.rootid)
			}
		}
	}
	const base = 1<<20 + 5*idmap.Size
	outside := tarOf(t, &tar.Header{Name: "x", Typeflag: tar.TypeReg, Uid: 0, Gid: base})
	if err := shiftTar(io.Discard, bytes.NewReader(outside), base, 0); !errors.Is(err, errOwner) {
		t.Fatalf("host root's file: %v, want errOwner", err)
	}
}

// TestShiftTarRefuses: what a sandbox's rw layer cannot hold is refused,
// naming the member and the field: an owner or a file capability's root
// outside the range, and an xattr other than security.capability (the
// only one a layer this host writes carries).
func TestShiftTarRefuses(t *testing.T) {
	for _, c := range []struct {
		name, field string
		h           *tar.Header
	}{
		{"uid", "uid", &tar.Header{Name: "f", Typeflag: tar.TypeReg, Uid: idmap.Size}},
		{"gid", "gid", &tar.Header{Name: "f", Typeflag: tar.TypeReg, Gid: idmap.Size + 9}},
		{"link", "uid", &tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "f", Uid: 1 << 31}},
		{"rootid", "security.capability", &tar.Header{Name: "f", Typeflag: tar.TypeReg,
			PAXRecords: map[string]string{capKey: capV3(idmap.Size)}}},
		{"capability size", "security.capability", &tar.Header{Name: "f", Typeflag: tar.TypeReg,
			PAXRecords: map[string]string{capKey: capV3(0)[:22]}}},
		{"overlay xattr", "xattr", &tar.Header{Name: "d/", Typeflag: tar.TypeDir,
			PAXRecords: map[string]string{"SCHILY.xattr.trusted.overlay.redirect": "/etc"}}},
		{"acl", "xattr", &tar.Header{Name: "f", Typeflag: tar.TypeReg,
			PAXRecords: map[string]string{"SCHILY.xattr.system.posix_acl_access": "\x02\x00\x00\x00"}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := io.Copy(io.Discard, shiftedIn(bytes.NewReader(tarOf(t, c.h)), 1<<20))
			var re *criu.RefusedError
			if !errors.As(err, &re) || !errors.Is(err, criu.ErrRefused) {
				t.Fatalf("applied: %v, want a criu.RefusedError", err)
			}
			if re.Field != c.field || re.Image != rwLayerImage {
				t.Fatalf("refused %q field %q, want %q field %q: %v", re.Image, re.Field, rwLayerImage, c.field, err)
			}
			t.Log(err)
		})
	}
	// The same layer, in range, passes.
	ok := tarOf(t, &tar.Header{Name: "f", Typeflag: tar.TypeReg, Uid: idmap.Size - 1, Gid: 0,
		PAXRecords: map[string]string{capKey: capV3(idmap.Size - 1), "SCHILY.xattr.security.capability.x": ""}})
	if _, err := io.Copy(io.Discard, shiftedIn(bytes.NewReader(ok), 1<<20)); err == nil {
		t.Fatal("an xattr named past security.capability passed")
	}
	ok = tarOf(t, &tar.Header{Name: "f", Typeflag: tar.TypeReg, Uid: idmap.Size - 1, Gid: 0,
		PAXRecords: map[string]string{capKey: capV3(idmap.Size - 1)}})
	if _, err := io.Copy(io.Discard, shiftedIn(bytes.NewReader(ok), 1<<20)); err != nil {
		t.Fatalf("a layer in range: %v", err)
	}
}

// rawBlock is a ustar header block as a hostile writer makes it, for what
// archive/tar does not write (a PAX header of GNU sparse records).
func rawBlock(name string, typeflag byte, size int) []byte {
	b := make([]byte, 512)
	copy(b[0:100], name)
	copy(b[100:], "0000644\x00")
	copy(b[108:], "0000000\x00")
	copy(b[116:], "0000000\x00")
	copy(b[124:], fmt.Sprintf("%011o\x00", size))
	copy(b[136:], fmt.Sprintf("%011o\x00", 0))
	copy(b[148:156], "        ")
	b[156] = typeflag
	copy(b[257:], "ustar\x0000")
	sum := 0
	for _, c := range b {
		sum += int(c)
	}
	copy(b[148:], fmt.Sprintf("%06o\x00 ", sum))
	return b
}

// padded is b with zeros up to a multiple of 512 bytes.
func padded(b []byte) []byte {
	return append(b, make([]byte, (512-len(b)%512)%512)...)
}

// paxRecord is one PAX extended header record.
func paxRecord(k, v string) string {
	n := len(k) + len(v) + 3
	for {
		s := fmt.Sprintf("%d %s=%s\n", n, k, v)
		if len(s) == n {
			return s
		}
		n = len(s)
	}
}

// A rw layer whose member is a GNU sparse file (5 bytes stored, 1 TiB
// declared) is refused before anything reads its data; one as this host
// writes it passes, and is read from its start.
func TestVetLayer(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, b []byte) *os.File {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(p)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	pax := paxRecord("GNU.sparse.major", "0") + paxRecord("GNU.sparse.minor", "1") +
		paxRecord("GNU.sparse.numblocks", "1") + paxRecord("GNU.sparse.map", "0,5") +
		paxRecord("GNU.sparse.size", "1099511627776")
	var sparse []byte
	sparse = append(sparse, rawBlock("PaxHeaders/big", 'x', len(pax))...)
	sparse = append(sparse, padded([]byte(pax))...)
	sparse = append(sparse, rawBlock("big", '0', 5)...)
	sparse = append(sparse, padded([]byte("hello"))...)
	sparse = append(sparse, make([]byte, 1024)...)
	// The fixture is what it means to be: archive/tar reads it as 1 TiB.
	tr := tar.NewReader(bytes.NewReader(sparse))
	if h, err := tr.Next(); err != nil || h.Size != 1<<40 {
		t.Fatalf("the sparse fixture reads as %+v, %v", h, err)
	}
	var re *criu.RefusedError
	if err := vetLayer(write("sparse.tar", sparse)); !errors.As(err, &re) || re.Field != "sparse" {
		t.Fatalf("vetLayer of a sparse member: %v, want refused (sparse)", err)
	}

	var plain bytes.Buffer
	tw := tar.NewWriter(&plain)
	for _, h := range []*tar.Header{{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755}, {Name: "etc/a", Typeflag: tar.TypeReg, Mode: 0o644, Size: 5}} {
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte("hello")[:h.Size]); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	f := write("plain.tar", plain.Bytes())
	if err := vetLayer(f); err != nil {
		t.Fatalf("vetLayer of a plain layer: %v", err)
	}
	if off, _ := f.Seek(0, io.SeekCurrent); off != 0 {
		t.Fatalf("vetLayer left the layer at %d", off)
	}
	if err := vetLayer(write("cut.tar", plain.Bytes()[:700])); !errors.As(err, &re) {
		t.Fatalf("vetLayer of a cut layer: %v, want refused", err)
	}
}

//go:build linux

package executor

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"testing"

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

// TestShiftTar: owners move between ranges both ways, a whiteout's
// owner is kept, and an owner outside the range is refused.
func TestShiftTar(t *testing.T) {
	const base = 1<<20 + 5*idmap.Size
	in := tarOf(t,
		&tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755, Uid: base, Gid: base},
		&tar.Header{Name: "etc/f", Typeflag: tar.TypeReg, Mode: 0o644, Uid: base + 1000, Gid: base + 65534, Size: 3,
			PAXRecords: map[string]string{"SCHILY.xattr.user.k": "v"}},
		&tar.Header{Name: "etc/.wh.gone", Typeflag: tar.TypeReg, Mode: 0o600},
	)
	var out bytes.Buffer
	if err := shiftTar(&out, bytes.NewReader(in), base, 0); err != nil {
		t.Fatal(err)
	}
	var back bytes.Buffer
	if err := shiftTar(&back, bytes.NewReader(out.Bytes()), 0, base+idmap.Size); err != nil {
		t.Fatal(err)
	}
	want := [][2]int{{0, 0}, {1000, 65534}, {0, 0}}
	wantBack := [][2]int{{base + idmap.Size, base + idmap.Size}, {base + idmap.Size + 1000, base + idmap.Size + 65534}, {0, 0}}
	for _, c := range []struct {
		b    []byte
		want [][2]int
	}{{out.Bytes(), want}, {back.Bytes(), wantBack}} {
		tr := tar.NewReader(bytes.NewReader(c.b))
		for i := 0; ; i++ {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				if i != len(c.want) {
					t.Fatalf("%d members, want %d", i, len(c.want))
				}
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := [2]int{h.Uid, h.Gid}; got != c.want[i] {
				t.Errorf("%s: owner %v, want %v", h.Name, got, c.want[i])
			}
			if h.Name == "etc/f" && h.PAXRecords["SCHILY.xattr.user.k"] != "v" {
				t.Errorf("%s lost its xattr: %v", h.Name, h.PAXRecords)
			}
		}
	}
	outside := tarOf(t, &tar.Header{Name: "x", Typeflag: tar.TypeReg, Uid: 0, Gid: base})
	if err := shiftTar(io.Discard, bytes.NewReader(outside), base, 0); !errors.Is(err, errOwner) {
		t.Fatalf("host root's file: %v, want errOwner", err)
	}
}

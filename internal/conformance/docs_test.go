package conformance

import (
	"bytes"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/runrecordd/runrecordd/internal/bundle"
	"github.com/runrecordd/runrecordd/internal/manifest"
	"github.com/runrecordd/runrecordd/internal/store"
	"github.com/runrecordd/runrecordd/pkg/record"
	"github.com/runrecordd/runrecordd/pkg/unit"
)

// The worked examples docs/ spells out in hex are the encoders' output,
// byte for byte: a block marked <!-- bytes: NAME --> is checked against
// NAME's encoder, and the address after → against the bytes' BLAKE3. Each
// example also decodes, as a second implementation's bytes would.
func TestDocBytes(t *testing.T) {
	digest := "sha256:" + strings.Repeat("0", 64)
	examples := map[string]func() ([]byte, error){
		"unit-spec": func() ([]byte, error) {
			s := unit.Spec{Image: "busybox", ImageDigest: digest, Args: []string{"sleep", "60"}, Env: []string{"A=1"},
				Mode: unit.TranscriptMode, Nonce: "00112233445566778899aabbccddeeff"}
			return s.Canonical()
		},
		"grants": func() ([]byte, error) {
			g := unit.Grants{MilliCPU: 500, Network: unit.Loopback, ReadOnly: []unit.Mount{{Source: "/srv/data", Target: "/data"}}}
			return g.Canonical()
		},
		"grants-limits": func() ([]byte, error) {
			g := unit.Grants{MemoryBytes: 64 << 20, Network: unit.NoNetwork, Limits: unit.Limits{Pids: 64, TranscriptBytes: 1 << 20}}
			return g.Canonical()
		},
		"grants-egress": func() ([]byte, error) {
			g := unit.Grants{MemoryBytes: 256 << 20, Network: unit.Egress, Egress: []unit.Dest{
				{CIDR: "203.0.113.0/24", Proto: "tcp", Ports: "443"},
				{Name: "pypi.org", Proto: "tcp", Ports: "80-443"},
			}}
			return g.Canonical()
		},
		"grants-secrets": func() ([]byte, error) {
			g := unit.Grants{Network: unit.NoNetwork, Secrets: []string{"API_KEY", "db.token"}}
			return g.Canonical()
		},
		"manifest": func() ([]byte, error) {
			return manifest.Manifest{manifest.Arch: "amd64", manifest.ImageDigest: digest, manifest.Protocol: "runrecordd.unit/1"}.Canonical()
		},
		"manifest-image": func() ([]byte, error) {
			return manifest.Manifest{manifest.Arch: "amd64", manifest.ContainerdVersion: "v2.3.7", manifest.CPUFlags: "avx fpu sse",
				manifest.CRIUImages: "criu-images/4.2", manifest.CRIUVersion: "4.2.1", manifest.ImageDigest: digest,
				manifest.KernelRelease: "6.18.0", manifest.RuncVersion: "1.5.3", manifest.UnitID: record.Sum([]byte("unit")).String()}.Canonical()
		},
		"listing": func() ([]byte, error) {
			return store.EncodeListing([]store.Entry{{Name: "core-1.img", Mode: 0o600, Size: 4, Address: record.Sum([]byte("core"))}})
		},
		"listing-nested": func() ([]byte, error) {
			return store.EncodeListing([]store.Entry{
				{Name: "a/b", Mode: 0o755, Size: 1, Address: record.Sum([]byte("b"))},
				{Name: "a.txt", Mode: 0o644, Size: 4, Address: record.Sum([]byte("core"))},
			})
		},
		"pack": func() ([]byte, error) {
			return bundle.AppendPack(bundle.AppendPack(nil, []byte("a")), make([]byte, 200)), nil
		},
		"slab-index": func() ([]byte, error) {
			idx, _ := slabExample()
			return idx, nil
		},
		"listing-slabs": func() ([]byte, error) {
			_, es := slabExample()
			return store.EncodeListing(es)
		},
		"listing-chunks": func() ([]byte, error) {
			es := []store.Entry{{Name: "core-1.img", Mode: 0o600, Size: 4, Address: record.Sum([]byte("core"))}}
			for _, c := range []struct{ vaddr, pages uint64 }{{0x400000, 1}, {0x7f0000003000, 1}, {0x7f0000004000, 4}} {
				b := bytes.Repeat([]byte{byte(c.vaddr / store.ChunkPage)}, int(c.pages*store.ChunkPage))
				es = append(es, store.Entry{Name: store.ChunkName("pages-1.img", c.vaddr), Mode: 0o600, Size: uint64(len(b)), Address: record.Sum(b)})
			}
			return store.EncodeListing(es)
		},
	}
	decoders := map[string]func([]byte) error{
		"unit-spec":      func(b []byte) error { _, err := unit.DecodeSpec(b); return err },
		"grants":         func(b []byte) error { _, err := unit.DecodeGrants(b); return err },
		"grants-limits":  func(b []byte) error { _, err := unit.DecodeGrants(b); return err },
		"grants-egress":  func(b []byte) error { _, err := unit.DecodeGrants(b); return err },
		"grants-secrets": func(b []byte) error { _, err := unit.DecodeGrants(b); return err },
		"manifest":       func(b []byte) error { _, err := manifest.Decode(b); return err },
		"manifest-image": func(b []byte) error { _, err := manifest.Decode(b); return err },
		"listing":        decodeListing(0),
		"listing-nested": decodeListing(0),
		"listing-chunks": decodeListing(1),
		"slab-index": func(b []byte) error {
			cs, err := store.DecodeSlabIndex(b, []uint64{6 * store.ChunkPage})
			if err == nil && len(cs) != 3 {
				err = fmt.Errorf("%d chunks, want 3", len(cs))
			}
			return err
		},
		"listing-slabs": func(b []byte) error {
			es, err := store.DecodeListing(b)
			if err != nil {
				return err
			}
			idx, _ := slabExample()
			cfs, err := store.ChunkedFiles(es, func(store.Entry) ([]byte, error) { return idx, nil })
			if err == nil && (len(cfs) != 1 || cfs[0].Size != 6*store.ChunkPage || len(cfs[0].Chunks) != 3) {
				err = fmt.Errorf("chunked files %+v", cfs)
			}
			return err
		},
		"pack": func(b []byte) error {
			var n int
			err := bundle.ReadPack(bytes.NewReader(b), int64(len(b)), func([]byte) error { n++; return nil })
			if err == nil && n != 2 {
				err = fmt.Errorf("%d objects, want 2", n)
			}
			return err
		},
	}
	found := docBlocks(t, "../../docs")
	for name, encode := range examples {
		blk, ok := found[name]
		if !ok {
			t.Errorf("%s: no <!-- bytes: %s --> block in docs/", name, name)
			continue
		}
		want, err := encode()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !bytes.Equal(blk.bytes, want) {
			t.Errorf("%s (%s): the doc's bytes\n%x\nthe encoder's\n%x", name, blk.doc, blk.bytes, want)
		}
		// A pack is a member, not an object: it has no address to state.
		if got := record.Sum(blk.bytes); name != "pack" && got.String() != blk.addr {
			t.Errorf("%s (%s): the doc's address %q, the bytes hash to %s", name, blk.doc, blk.addr, got)
		} else if name == "pack" && blk.addr != "" {
			t.Errorf("%s (%s): a pack states no address", name, blk.doc)
		}
		if err := decoders[name](blk.bytes); err != nil {
			t.Errorf("%s (%s): the doc's bytes do not decode: %v", name, blk.doc, err)
		}
	}
	for name, blk := range found {
		if examples[name] == nil {
			t.Errorf("%s: a block of bytes no test checks", blk.doc)
		}
	}
}

// slabExample is docs/store.md's worked example in the slab form: the
// index, and the listing's entries.
func slabExample() ([]byte, []store.Entry) {
	var slab []byte
	var cs []store.SlabChunk
	for _, c := range []struct{ vaddr, pages uint64 }{{0x400000, 1}, {0x7f0000003000, 1}, {0x7f0000004000, 4}} {
		b := bytes.Repeat([]byte{byte(c.vaddr / store.ChunkPage)}, int(c.pages*store.ChunkPage))
		cs = append(cs, store.SlabChunk{Vaddr: c.vaddr, Size: uint64(len(b)), Offset: uint64(len(slab)), Address: record.Sum(b)})
		slab = append(slab, b...)
	}
	idx := store.EncodeSlabIndex(cs)
	return idx, []store.Entry{{Name: "core-1.img", Mode: 0o600, Size: 4, Address: record.Sum([]byte("core"))},
		{Name: store.SlabName("pages-1.img", 0), Mode: 0o600, Size: uint64(len(slab)), Address: record.Sum(slab)},
		{Name: store.SlabIndexName("pages-1.img"), Mode: 0o600, Size: uint64(len(idx)), Address: record.Sum(idx)}}
}

// decodeListing decodes a listing and reads its chunked files, of which
// it must hold chunked.
func decodeListing(chunked int) func([]byte) error {
	return func(b []byte) error {
		es, err := store.DecodeListing(b)
		if err != nil {
			return err
		}
		cfs, err := store.ChunkedFiles(es, nil)
		if err == nil && len(cfs) != chunked {
			err = fmt.Errorf("%d chunked files, want %d", len(cfs), chunked)
		}
		return err
	}
}

type docBlock struct {
	doc   string // file:line of the marker
	bytes []byte
	addr  string // the address after →, if any
}

var marker = regexp.MustCompile(`^<!-- bytes: ([a-z0-9-]+) -->$`)

// docBlocks reads every marked block of the docs in dir. A block's line is
// hex, then two or more spaces and a comment; hex is groups of hex digits
// separated by single spaces; a group XX×N stands for N bytes XX, and a
// group "TEXT" (no space inside) for TEXT's bytes. A
// line of comment alone starts with spaces; "→ ADDRESS" states the
// address of the bytes.
func docBlocks(t *testing.T, dir string) map[string]docBlock {
	files, err := filepath.Glob(filepath.Join(dir, "*.md"))
	if err != nil || len(files) == 0 {
		t.Fatalf("docs in %s: %v", dir, err)
	}
	out := map[string]docBlock{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		for i := 0; i < len(lines); i++ {
			m := marker.FindStringSubmatch(lines[i])
			if m == nil {
				continue
			}
			blk := docBlock{doc: filepath.Base(f) + ":" + strconv.Itoa(i+1)}
			if _, dup := out[m[1]]; dup {
				t.Fatalf("%s: a second block %s", blk.doc, m[1])
			}
			if i+1 >= len(lines) || lines[i+1] != "```" {
				t.Fatalf("%s: the marker is not followed by a ``` block", blk.doc)
			}
			for i += 2; i < len(lines) && lines[i] != "```"; i++ {
				blk.parse(t, lines[i])
			}
			out[m[1]] = blk
		}
	}
	return out
}

func (blk *docBlock) parse(t *testing.T, line string) {
	if a, ok := strings.CutPrefix(line, "→ "); ok {
		blk.addr = a
		return
	}
	hexPart, _, _ := strings.Cut(line, "  ")
	for _, g := range strings.Split(hexPart, " ") {
		if g == "" {
			continue
		}
		if q, ok := strings.CutPrefix(g, `"`); ok && strings.HasSuffix(q, `"`) {
			blk.bytes = append(blk.bytes, strings.TrimSuffix(q, `"`)...)
			continue
		}
		if x, n, ok := strings.Cut(g, "×"); ok {
			v, err1 := hex.DecodeString(x)
			c, err2 := strconv.Atoi(n)
			if err1 != nil || err2 != nil || len(v) != 1 {
				t.Fatalf("%s: %q is not XX×N", blk.doc, g)
			}
			blk.bytes = append(blk.bytes, bytes.Repeat(v, c)...)
			continue
		}
		v, err := hex.DecodeString(g)
		if err != nil {
			t.Fatalf("%s: %q is not hex: %v", blk.doc, g, err)
		}
		blk.bytes = append(blk.bytes, v...)
	}
}

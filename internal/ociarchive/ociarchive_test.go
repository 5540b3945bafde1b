package ociarchive

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// readTar returns the regular files and directories of a tar stream, in
// order, with their headers.
func readTar(t *testing.T, r io.Reader) ([]*tar.Header, map[string][]byte) {
	t.Helper()
	tr := tar.NewReader(r)
	var hdrs []*tar.Header
	files := map[string][]byte{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return hdrs, files
		}
		if err != nil {
			t.Fatal(err)
		}
		hdrs = append(hdrs, h)
		if h.Typeflag == tar.TypeReg {
			data, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[h.Name] = data
		}
	}
}

func blobOf(t *testing.T, files map[string][]byte, d ocispec.Descriptor) []byte {
	t.Helper()
	data, ok := files["blobs/sha256/"+d.Digest.Encoded()]
	if !ok {
		t.Fatalf("no blob %s", d.Digest)
	}
	sum := sha256.Sum256(data)
	if hex.EncodeToString(sum[:]) != d.Digest.Encoded() || int64(len(data)) != d.Size {
		t.Fatalf("blob %s: digest or size does not match its descriptor", d.Digest)
	}
	return data
}

func TestLayout(t *testing.T) {
	img := Unit("runrecordd.test/demo:1", []byte("#!program bytes"))
	var buf bytes.Buffer
	d, err := Write(&buf, img)
	if err != nil {
		t.Fatal(err)
	}
	hdrs, files := readTar(t, &buf)
	for _, h := range hdrs {
		if !h.ModTime.Equal(Epoch) || h.Uid != 0 || h.Gid != 0 {
			t.Errorf("%s: mtime %v owner %d:%d", h.Name, h.ModTime, h.Uid, h.Gid)
		}
	}
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Fatalf("oci-layout %s", files["oci-layout"])
	}
	var index ocispec.Index
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatal(err)
	}
	if len(index.Manifests) != 1 {
		t.Fatalf("index has %d manifests", len(index.Manifests))
	}
	m := index.Manifests[0]
	if m.Digest != d.Manifest || m.Annotations[AnnotationImageName] != img.Name ||
		m.Annotations[ocispec.AnnotationRefName] != "1" || m.Platform.OS != "linux" || m.Platform.Architecture != "amd64" {
		t.Fatalf("index entry %+v", m)
	}
	var manifest ocispec.Manifest
	if err := json.Unmarshal(blobOf(t, files, m), &manifest); err != nil {
		t.Fatal(err)
	}
	var config ocispec.Image
	if err := json.Unmarshal(blobOf(t, files, manifest.Config), &config); err != nil {
		t.Fatal(err)
	}
	if strings.Join(config.Config.Entrypoint, " ") != UnitPath || config.OS != "linux" || config.Architecture != "amd64" ||
		len(config.RootFS.DiffIDs) != 1 || config.RootFS.DiffIDs[0] != d.DiffID {
		t.Fatalf("config %+v", config)
	}
	if len(manifest.Layers) != 1 || manifest.Layers[0].MediaType != ocispec.MediaTypeImageLayerGzip || manifest.Layers[0].Digest != d.Layer {
		t.Fatalf("layers %+v", manifest.Layers)
	}
	zr, err := gzip.NewReader(bytes.NewReader(blobOf(t, files, manifest.Layers[0])))
	if err != nil {
		t.Fatal(err)
	}
	layer, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(layer)
	if "sha256:"+hex.EncodeToString(sum[:]) != d.DiffID.String() {
		t.Fatal("diff id is not the digest of the uncompressed layer")
	}
	lh, lfiles := readTar(t, bytes.NewReader(layer))
	var names []string
	for _, h := range lh {
		names = append(names, h.Name+":"+strconv.FormatInt(h.Mode, 8))
	}
	if got := strings.Join(names, " "); got != "tmp/:1777 unit:755" {
		t.Fatalf("layer entries %s", got)
	}
	if string(lfiles["unit"]) != "#!program bytes" {
		t.Fatal("program bytes differ")
	}
}

// TestDeterministic: the same image gives the same bytes, hence the same
// digests, every time; a different program gives a different manifest.
func TestDeterministic(t *testing.T) {
	img := Unit("runrecordd.test/demo:1", bytes.Repeat([]byte("x"), 1<<16))
	img.Files = append(img.Files, File{Path: "/etc/a/b", Mode: 0o644, Data: []byte("b")})
	var a, b bytes.Buffer
	da, err := Write(&a, img)
	if err != nil {
		t.Fatal(err)
	}
	db, err := Write(&b, img)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) || da != db {
		t.Fatal("two writes of one image differ")
	}
	img.Files[0].Data = []byte("y")
	dc, err := Write(io.Discard, img)
	if err != nil {
		t.Fatal(err)
	}
	if dc.Manifest == da.Manifest {
		t.Fatal("different programs, same manifest")
	}
}

func TestInvalid(t *testing.T) {
	for name, img := range map[string]Image{
		"no name":        {Files: []File{{Path: "/a", Data: nil}}},
		"file twice":     {Name: "x", Files: []File{{Path: "/a"}, {Path: "a"}}},
		"file and dir":   {Name: "x", Files: []File{{Path: "/a/b"}, {Path: "/a"}}},
		"root as a file": {Name: "x", Files: []File{{Path: "/"}}},
	} {
		if _, err := Write(io.Discard, img); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

// TestGoBinary builds a demo unit twice: static, and byte for byte the same.
func TestGoBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a Go program")
	}
	ctx := context.Background()
	a, err := GoBinary(ctx, "../..", "./units/ballast")
	if err != nil {
		t.Fatal(err)
	}
	b, err := GoBinary(ctx, "../..", "./units/ballast")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a, b) {
		t.Fatal("two builds differ")
	}
	if !bytes.HasPrefix(a, []byte("\x7fELF")) || bytes.Contains(a, []byte("ld-linux")) {
		t.Fatal("not a static ELF program")
	}
	path := filepath.Join(t.TempDir(), "ballast.tar")
	if _, err := WriteFile(path, Unit("runrecordd.test/ballast:1", a)); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Size() == 0 {
		t.Fatalf("archive: %v %v", fi, err)
	}
}

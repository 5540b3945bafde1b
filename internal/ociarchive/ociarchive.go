// Package ociarchive writes single-layer OCI image archives in pure Go and
// builds the static Go programs that go in them.
//
// An archive is a tar stream of an OCI image layout (oci-layout, index.json,
// blobs/sha256/…) holding one linux/amd64 image: one gzip-compressed layer
// tar, a config with the entrypoint, and a manifest. containerd's Import reads
// it as it reads any `oci-archive`.
//
// # Determinism
//
// Every timestamp in both tars and in the gzip header is fixed to [Epoch],
// owners are 0:0, entries are sorted by path, and the JSON documents are
// encoded from structs (fixed field order). The same [Image] therefore always
// yields the same bytes, so the same manifest digest: an image digest recorded
// in an environment manifest stays stable across rebuilds. [GoBinary] builds
// with -trimpath and without VCS stamping so that, for one toolchain and one
// source tree, the program bytes are stable too.
package ociarchive

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	digest "github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"

	"github.com/runrecordd/runrecordd/internal/atomicfile"
)

// Epoch is the modification time of every entry the package writes.
var Epoch = time.Unix(0, 0).UTC()

// AnnotationImageName is the index annotation containerd's importer turns
// into an image name (containerd's images.AnnotationImageName).
const AnnotationImageName = "io.containerd.image.name"

// UnitPath is where [Unit] places the program inside the image.
const UnitPath = "/unit"

// File is one regular file in the image's layer.
type File struct {
	// Path is absolute inside the image, e.g. "/unit".
	Path string
	// Mode holds the permission bits (0o755 for a program).
	Mode fs.FileMode
	Data []byte
}

// Image is what goes into an archive.
type Image struct {
	// Name is the full reference containerd gives the imported image
	// ("runrecordd.local/oracle:1"); its tag part becomes the OCI ref name.
	Name string
	// Files are the layer's regular files; parent directories are
	// created (0755) as needed.
	Files []File
	// Dirs are extra empty directories with their modes, e.g. "/tmp": 01777.
	Dirs map[string]fs.FileMode
	// Entrypoint, Cmd, Env and WorkingDir fill the image config.
	Entrypoint []string
	Cmd        []string
	Env        []string
	WorkingDir string
}

// Digests names the blobs of a written archive.
type Digests struct {
	// Manifest is the image manifest's digest: the image's identity.
	Manifest digest.Digest
	// Config is the config blob's digest (the image ID in docker's terms).
	Config digest.Digest
	// Layer is the compressed layer's digest; DiffID the uncompressed one.
	Layer  digest.Digest
	DiffID digest.Digest
}

// Unit is the image of one static program at [UnitPath], run as the
// entrypoint, with a world-writable /tmp.
func Unit(name string, program []byte) Image {
	return Image{
		Name:       name,
		Files:      []File{{Path: UnitPath, Mode: 0o755, Data: program}},
		Dirs:       map[string]fs.FileMode{"/tmp": fs.ModeSticky | 0o777},
		Entrypoint: []string{UnitPath},
		Env:        []string{"PATH=/"},
		WorkingDir: "/",
	}
}

type blob struct {
	desc ocispec.Descriptor
	data []byte
}

func newBlob(mediaType string, data []byte) blob {
	sum := sha256.Sum256(data)
	return blob{
		desc: ocispec.Descriptor{
			MediaType: mediaType,
			Digest:    digest.NewDigestFromEncoded(digest.SHA256, hex.EncodeToString(sum[:])),
			Size:      int64(len(data)),
		},
		data: data,
	}
}

// Write writes img as an OCI archive to w.
func Write(w io.Writer, img Image) (Digests, error) {
	if img.Name == "" {
		return Digests{}, errors.New("ociarchive: image has no name")
	}
	layerTar, err := layer(img)
	if err != nil {
		return Digests{}, fmt.Errorf("ociarchive: layer of %s: %w", img.Name, err)
	}
	diffID := digest.FromBytes(layerTar)
	gz, err := gzipped(layerTar)
	if err != nil {
		return Digests{}, fmt.Errorf("ociarchive: compress layer of %s: %w", img.Name, err)
	}
	layerBlob := newBlob(ocispec.MediaTypeImageLayerGzip, gz)

	config := ocispec.Image{
		Platform: ocispec.Platform{Architecture: "amd64", OS: "linux"},
		Config: ocispec.ImageConfig{
			Entrypoint: img.Entrypoint,
			Cmd:        img.Cmd,
			Env:        img.Env,
			WorkingDir: img.WorkingDir,
		},
		RootFS: ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{diffID}},
	}
	configJSON, err := json.Marshal(config)
	if err != nil {
		return Digests{}, fmt.Errorf("ociarchive: config of %s: %w", img.Name, err)
	}
	configBlob := newBlob(ocispec.MediaTypeImageConfig, configJSON)

	manifest := ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageManifest,
		Config:    configBlob.desc,
		Layers:    []ocispec.Descriptor{layerBlob.desc},
	}
	manifestJSON, err := json.Marshal(manifest)
	if err != nil {
		return Digests{}, fmt.Errorf("ociarchive: manifest of %s: %w", img.Name, err)
	}
	manifestBlob := newBlob(ocispec.MediaTypeImageManifest, manifestJSON)

	mdesc := manifestBlob.desc
	mdesc.Platform = &ocispec.Platform{Architecture: "amd64", OS: "linux"}
	mdesc.Annotations = map[string]string{
		AnnotationImageName:       img.Name,
		ocispec.AnnotationRefName: refName(img.Name),
	}
	index := ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2},
		MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{mdesc},
	}
	indexJSON, err := json.Marshal(index)
	if err != nil {
		return Digests{}, fmt.Errorf("ociarchive: index of %s: %w", img.Name, err)
	}
	layoutJSON, err := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err != nil {
		return Digests{}, fmt.Errorf("ociarchive: layout of %s: %w", img.Name, err)
	}

	tw := tar.NewWriter(w)
	entries := []struct {
		name string
		data []byte
	}{
		{ocispec.ImageLayoutFile, layoutJSON},
		{"index.json", indexJSON},
	}
	blobs := []blob{configBlob, layerBlob, manifestBlob}
	sort.Slice(blobs, func(i, j int) bool { return blobs[i].desc.Digest < blobs[j].desc.Digest })
	for _, b := range blobs {
		entries = append(entries, struct {
			name string
			data []byte
		}{"blobs/sha256/" + b.desc.Digest.Encoded(), b.data})
	}
	for _, dir := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(dirHeader(dir, 0o755)); err != nil {
			return Digests{}, fmt.Errorf("ociarchive: write %s: %w", img.Name, err)
		}
	}
	for _, e := range entries {
		if err := tw.WriteHeader(fileHeader(e.name, 0o644, int64(len(e.data)))); err != nil {
			return Digests{}, fmt.Errorf("ociarchive: write %s: %w", img.Name, err)
		}
		if _, err := tw.Write(e.data); err != nil {
			return Digests{}, fmt.Errorf("ociarchive: write %s: %w", img.Name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return Digests{}, fmt.Errorf("ociarchive: write %s: %w", img.Name, err)
	}
	return Digests{
		Manifest: manifestBlob.desc.Digest,
		Config:   configBlob.desc.Digest,
		Layer:    layerBlob.desc.Digest,
		DiffID:   diffID,
	}, nil
}

// WriteFile writes img as an OCI archive at path, durably, mode 0644
// ([atomicfile.Write]): a crash leaves either the old archive or the whole
// new one.
func WriteFile(path string, img Image) (Digests, error) {
	var d Digests
	err := atomicfile.Write(path, 0o644, func(f *os.File) (err error) {
		d, err = Write(f, img)
		return err
	})
	if err != nil {
		return Digests{}, fmt.Errorf("ociarchive: write %s: %w", path, err)
	}
	return d, nil
}

// refName is the tag of a reference ("latest" when it has none), the form
// the OCI ref.name annotation takes in archives written by containerd.
func refName(name string) string {
	if i := strings.LastIndexAny(name, ":/"); i >= 0 && name[i] == ':' {
		return name[i+1:]
	}
	return "latest"
}

// layer is the uncompressed layer tar: directories first (parents before
// children), then files, each group sorted by path.
func layer(img Image) ([]byte, error) {
	dirs := map[string]fs.FileMode{}
	addParents := func(p string) {
		for d := path.Dir(p); d != "/" && d != "."; d = path.Dir(d) {
			if _, ok := dirs[d]; !ok {
				dirs[d] = 0o755
			}
		}
	}
	for d, mode := range img.Dirs {
		d = path.Clean("/" + d)
		if d == "/" {
			continue
		}
		dirs[d] = mode
		addParents(d)
	}
	files := map[string]File{}
	for _, f := range img.Files {
		p := path.Clean("/" + f.Path)
		if p == "/" {
			return nil, fmt.Errorf("file with empty path")
		}
		if _, dup := files[p]; dup {
			return nil, fmt.Errorf("file %s twice", p)
		}
		if _, isDir := dirs[p]; isDir {
			return nil, fmt.Errorf("%s is both a file and a directory", p)
		}
		f.Path = p
		files[p] = f
		addParents(p)
	}
	dirNames := make([]string, 0, len(dirs))
	for d := range dirs {
		if _, isFile := files[d]; isFile {
			return nil, fmt.Errorf("%s is both a file and a directory", d)
		}
		dirNames = append(dirNames, d)
	}
	sort.Strings(dirNames)
	fileNames := make([]string, 0, len(files))
	for p := range files {
		fileNames = append(fileNames, p)
	}
	sort.Strings(fileNames)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, d := range dirNames {
		if err := tw.WriteHeader(dirHeader(d[1:]+"/", dirs[d])); err != nil {
			return nil, err
		}
	}
	for _, p := range fileNames {
		f := files[p]
		if err := tw.WriteHeader(fileHeader(p[1:], f.Mode, int64(len(f.Data)))); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.Data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarMode converts permission, setuid, setgid and sticky bits to tar's.
func tarMode(m fs.FileMode) int64 {
	mode := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		mode |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		mode |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		mode |= 0o1000
	}
	return mode
}

func dirHeader(name string, mode fs.FileMode) *tar.Header {
	return &tar.Header{
		Typeflag: tar.TypeDir,
		Name:     name,
		Mode:     tarMode(mode),
		ModTime:  Epoch,
		Format:   tar.FormatPAX,
	}
}

func fileHeader(name string, mode fs.FileMode, size int64) *tar.Header {
	return &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     name,
		Mode:     tarMode(mode),
		Size:     size,
		ModTime:  Epoch,
		Format:   tar.FormatPAX,
	}
}

func gzipped(data []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	// The header's ModTime stays zero and Name empty: nothing varies.
	if _, err := zw.Write(data); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// GoBinary builds the Go main package pkg (an import path or a ./relative
// path, resolved in dir) as a static linux/amd64 program and returns its
// bytes: CGO_ENABLED=0, -trimpath, -buildvcs=false, symbol tables stripped.
func GoBinary(ctx context.Context, dir, pkg string) ([]byte, error) {
	out, err := os.MkdirTemp("", "ociarchive-build-")
	if err != nil {
		return nil, fmt.Errorf("ociarchive: build %s: %w", pkg, err)
	}
	defer os.RemoveAll(out)
	bin := filepath.Join(out, "unit")
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-buildvcs=false",
		"-ldflags=-s -w -buildid=", "-o", bin, pkg)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64")
	if msg, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ociarchive: build %s: %w: %s", pkg, err, bytes.TrimSpace(msg))
	}
	data, err := os.ReadFile(bin)
	if err != nil {
		return nil, fmt.Errorf("ociarchive: build %s: %w", pkg, err)
	}
	return data, nil
}
